"""Read planner: executing a plan on fake files reproduces every wanted byte; SSD ops are
4 KiB aligned, merged through small gaps, split at the maximum; the command bound."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flatcake.config import PlannerConfig
from flatcake.control.address import Medium, encode_address
from flatcake.control.index import BlockIndex, HitRun, Segment
from flatcake.layout import SegmentLayout
from flatcake.plan.reads import plan_reads
from flatcake.readplan import CopyOp, ReadOp, ReadPlan
from tests.control.helpers import keys

K = 4096
NOISE = 0xEE


class World:
    """Segments laid out in fake session files and a fake arena, with known bytes."""

    def __init__(self, num_layers: int, bbpl: int) -> None:
        self.num_layers, self.bbpl = num_layers, bbpl
        self.files: dict[int, bytearray] = {}
        self.file_end: dict[int, int] = {}
        self.arena = bytearray()
        self.next_id = 0

    def block_bytes(self, seg: Segment, pos: int, layer: int) -> bytes:
        return random.Random(seg.segment_id * 1_000_003 + pos * 101 + layer).randbytes(
            self.bbpl)

    def add_ssd(self, file_id: int, n: int, base: int = 0) -> Segment:
        off = self.file_end.get(file_id, K)
        lay = SegmentLayout.for_ssd(n, (self.bbpl,) * self.num_layers)
        self.next_id += 1
        seg = Segment(self.next_id, "s", Medium.SSD,
                      encode_address(Medium.SSD, 0, base + off), lay,
                      tuple(keys(self.next_id * 1000, self.next_id * 1000 + n)), 0,
                      file_id, off)
        f = self.files.setdefault(file_id, bytearray())
        f.extend(bytes([NOISE]) * (off + lay.total_bytes - len(f)))
        for layer in range(self.num_layers):
            for j in range(n):
                at = off + lay.block_offset(layer, j)
                f[at:at + self.bbpl] = self.block_bytes(seg, j, layer)
        self.file_end[file_id] = off + lay.total_bytes
        return seg

    def add_memory(self, n: int) -> Segment:
        off = len(self.arena)
        lay = SegmentLayout.for_memory(n, (self.bbpl,) * self.num_layers)
        self.next_id += 1
        seg = Segment(self.next_id, "s", Medium.MEMORY, encode_address(Medium.MEMORY, 0, off),
                      lay, tuple(keys(self.next_id * 1000, self.next_id * 1000 + n)), 0)
        self.arena.extend(bytes([NOISE]) * lay.total_bytes)
        for layer in range(self.num_layers):
            for j in range(n):
                at = off + lay.block_offset(layer, j)
                self.arena[at:at + self.bbpl] = self.block_bytes(seg, j, layer)
        return seg

    def expected(self, runs: list[HitRun], layer: int) -> bytes:
        out = b""
        for seg, start, count, _ in runs:
            out += b"".join(self.block_bytes(seg, start + k, layer) for k in range(count))
        return out

    def execute(self, plan: ReadPlan, layer: int, total_blocks: int) -> bytes:
        """Carry out one layer of the plan the way a reader would; every destination
        byte must be written exactly once."""
        dest = bytearray(total_blocks * self.bbpl)
        written: list[tuple[int, int]] = []
        lp = plan.layers[layer]
        ops: list[tuple[bytes, ReadOp | CopyOp]] = []
        for op in lp.ssd_ops:
            data = bytes(self.files[op.file_id][op.file_offset:op.file_offset + op.length])
            data += bytes([NOISE]) * (op.length - len(data))  # past EOF reads zeros/noise
            ops.append((data, op))
        for cop in lp.memory_ops:
            ops.append((bytes(self.arena[cop.arena_offset:cop.arena_offset + cop.length]),
                        cop))
        for data, anyop in ops:
            for p in anyop.pieces:
                at = p.dest_offset
                dest[at:at + p.length] = data[p.offset_in_op:p.offset_in_op + p.length]
                written.append((at, at + p.length))
        pos = 0
        for lo, hi in sorted(written):
            assert lo == pos and hi > lo, "a destination byte was written twice or never"
            pos = hi
        assert pos == len(dest)
        return bytes(dest)


def as_runs(segs_and_ranges: list[tuple[Segment, int, int]]) -> list[HitRun]:
    runs, pos = [], 0
    for seg, start, count in segs_and_ranges:
        runs.append(HitRun(seg, start, count, pos))
        pos += count
    return runs


class TestScenarios:
    def test_one_segment_history_restores_in_one_read_per_layer(self) -> None:
        w = World(num_layers=8, bbpl=K)
        seg = w.add_ssd(0, 64)
        plan = plan_reads(as_runs([(seg, 0, 64)]), 8)
        assert plan.num_commands == 8
        assert plan.useful_bytes == plan.bytes_read == 8 * 64 * K and plan.gap_bytes == 0
        for layer in range(8):
            (op,) = plan.layers[layer].ssd_ops
            assert op.file_offset == seg.file_offset + seg.layout.layer_offset(layer)  # type: ignore[operator]
            assert w.execute(plan, layer, 64) == w.expected(as_runs([(seg, 0, 64)]), layer)

    def test_small_gap_is_read_through_large_gap_is_not(self) -> None:
        w = World(num_layers=2, bbpl=K)
        seg = w.add_ssd(0, 40)
        # Blocks 0..4 and 6..10: a one-block (4 KiB) hole.
        runs = as_runs([(seg, 0, 5), (seg, 6, 5)])
        merged = plan_reads(runs, 2, cfg=PlannerConfig(gap_limit_bytes=64 * 1024))
        assert merged.num_commands == 2 and merged.gap_bytes == 2 * K
        split = plan_reads(runs, 2, cfg=PlannerConfig(gap_limit_bytes=K))  # 4K is not < 4K
        assert split.num_commands == 4 and split.gap_bytes == 0
        for plan in (merged, split):
            for layer in range(2):
                assert w.execute(plan, layer, 10) == w.expected(runs, layer)

    def test_touching_ranges_merge_even_with_zero_gap_limit(self) -> None:
        w = World(num_layers=1, bbpl=K)
        seg = w.add_ssd(0, 10)
        plan = plan_reads(as_runs([(seg, 0, 3), (seg, 3, 4)]), 1,
                          cfg=PlannerConfig(gap_limit_bytes=0))
        assert plan.num_commands == 1

    def test_unaligned_blocks_are_widened_and_counted_as_gap(self) -> None:
        w = World(num_layers=3, bbpl=1000)
        seg = w.add_ssd(0, 7)
        runs = as_runs([(seg, 2, 3)])
        plan = plan_reads(runs, 3)
        for lp in plan.layers:
            for op in lp.ssd_ops:
                assert op.file_offset % K == 0 and op.length % K == 0
        assert plan.useful_bytes == 3 * 3 * 1000
        assert plan.gap_bytes == plan.bytes_read - plan.useful_bytes > 0
        for layer in range(3):
            assert w.execute(plan, layer, 3) == w.expected(runs, layer)

    def test_split_at_max_read_bytes_even_inside_a_block(self) -> None:
        w = World(num_layers=2, bbpl=3 * K + 512)
        seg = w.add_ssd(0, 9)
        runs = as_runs([(seg, 0, 9)])
        plan = plan_reads(runs, 2, cfg=PlannerConfig(max_read_bytes=2 * K))
        for lp in plan.layers:
            assert all(op.length <= 2 * K for op in lp.ssd_ops)
        assert any(p.dest_offset % w.bbpl for lp in plan.layers for op in lp.ssd_ops
                   for p in op.pieces)
        for layer in range(2):
            assert w.execute(plan, layer, 9) == w.expected(runs, layer)

    def test_memory_runs_become_copies_merged_when_adjacent(self) -> None:
        w = World(num_layers=2, bbpl=100)
        m = w.add_memory(10)
        runs = as_runs([(m, 0, 4), (m, 4, 3), (m, 8, 2)])
        plan = plan_reads(runs, 2)
        assert plan.num_commands == 0 and plan.num_copies == 4  # (0..7) and (8..10) x 2
        assert plan.memory_bytes == 2 * 9 * 100
        for layer in range(2):
            assert w.execute(plan, layer, 9) == w.expected(runs, layer)

    def test_ssd_runs_read_their_segments_file(self) -> None:
        # The file and offset come from the segment itself, wherever its virtual
        # address lies: a restore asks the SSD space nothing.
        w = World(num_layers=1, bbpl=K)
        seg = w.add_ssd(5, 2, base=1 << 40)
        plan = plan_reads(as_runs([(seg, 0, 2)]), 1)
        op = plan.layers[0].ssd_ops[0]
        start = seg.file_offset + seg.layout.data_offset  # type: ignore[operator]
        assert op.file_id == 5 and op.file_offset <= start < op.file_offset + op.length
        assert w.execute(plan, 0, 2) == w.expected(as_runs([(seg, 0, 2)]), 0)

    def test_empty_hit(self) -> None:
        plan = plan_reads([], 4)
        assert plan.layers == () and plan.num_commands == plan.bytes_read == 0

    def test_bad_input(self) -> None:
        w = World(num_layers=2, bbpl=64)
        seg = w.add_ssd(0, 2)
        with pytest.raises(ValueError, match="num_layers"):
            plan_reads(as_runs([(seg, 0, 2)]), 3)
        with pytest.raises(ValueError, match="num_layers"):
            plan_reads([], 0)
        with pytest.raises(ValueError, match="outside segment"):
            plan_reads([HitRun(seg, 1, 2, 0)], 2)
        with pytest.raises(ValueError, match="same bytes"):
            plan_reads(as_runs([(seg, 0, 2), (seg, 1, 1)]), 2)
        other = World(num_layers=2, bbpl=128).add_ssd(1, 1)
        with pytest.raises(ValueError, match="geometry"):
            plan_reads(as_runs([(seg, 0, 2), (other, 0, 1)]), 2)


class TestCommandBound:
    @pytest.mark.parametrize("turns", [1, 2, 7, 20])
    def test_history_of_t_segments_restores_in_at_most_layers_times_t(self, turns: int) -> None:
        # A session's turns append to its file; the index returns the history as runs.
        num_layers = 6
        w = World(num_layers=num_layers, bbpl=2 * K)
        idx = BlockIndex()
        history: list[bytes] = []
        rng = random.Random(turns)
        for _ in range(turns):
            seg = w.add_ssd(0, rng.randint(1, 30))
            idx.publish(seg)
            history += seg.keys
        mem = w.add_memory(3)
        idx.publish(mem)
        history += mem.keys
        hit = idx.lookup(history)
        assert hit.num_blocks == len(history) and len(hit.runs) == turns + 1
        plan = plan_reads(hit.runs, num_layers)
        assert plan.num_commands <= num_layers * turns
        assert plan.num_copies == num_layers  # one arena copy per layer
        # Far fewer commands than layers x blocks.
        assert plan.num_commands < num_layers * hit.num_ssd_blocks or hit.num_ssd_blocks == 1
        for layer in range(num_layers):
            assert w.execute(plan, layer, hit.num_blocks) == w.expected(list(hit.runs), layer)


@st.composite
def worlds(draw: st.DrawFn) -> tuple[World, list[HitRun], PlannerConfig]:
    num_layers = draw(st.integers(1, 4))
    bbpl = draw(st.one_of(st.integers(1, 9000), st.sampled_from([K, 2 * K, 16 * K])))
    w = World(num_layers, bbpl)
    segs = []
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            segs.append(w.add_ssd(draw(st.integers(0, 2)), draw(st.integers(1, 8))))
        else:
            segs.append(w.add_memory(draw(st.integers(1, 8))))
    picks = []
    taken: set[tuple[int, int]] = set()
    for _ in range(draw(st.integers(0, 6))):
        seg = draw(st.sampled_from(segs))
        start = draw(st.integers(0, seg.num_blocks - 1))
        count = draw(st.integers(1, seg.num_blocks - start))
        wanted = {(seg.segment_id, p) for p in range(start, start + count)}
        if wanted & taken:  # a lookup never returns the same block twice
            continue
        taken |= wanted
        picks.append((seg, start, count))
    cfg = PlannerConfig(
        gap_limit_bytes=draw(st.sampled_from([0, 1, K, 3 * K, 64 * 1024, 1 << 20])),
        max_read_bytes=draw(st.sampled_from([K, 2 * K, 12 * K, 64 << 20])),
    )
    return w, as_runs(picks), cfg


@settings(max_examples=150, deadline=None)
@given(worlds())
def test_plans_reproduce_every_wanted_byte(case: tuple[World, list[HitRun], PlannerConfig]
                                           ) -> None:
    w, runs, cfg = case
    plan = plan_reads(runs, w.num_layers, cfg=cfg)
    total = sum(r.num_blocks for r in runs)
    ssd_blocks = sum(r.num_blocks for r in runs if r.segment.medium == Medium.SSD)
    assert plan.num_blocks == total
    assert plan.useful_bytes == (w.num_layers * ssd_blocks * w.bbpl if runs else 0)
    assert plan.bytes_read == sum(op.length for lp in plan.layers for op in lp.ssd_ops)
    assert plan.gap_bytes == plan.bytes_read - plan.useful_bytes >= 0
    assert plan.num_commands == sum(len(lp.ssd_ops) for lp in plan.layers)
    for lp in plan.layers:
        prev: ReadOp | None = None
        for op in lp.ssd_ops:
            assert op.file_offset % K == 0 and op.length % K == 0
            assert 0 < op.length <= cfg.max_read_bytes
            if prev is not None and prev.file_id == op.file_id:
                hole = op.file_offset - (prev.file_offset + prev.length)
                assert hole >= 0  # sorted, disjoint
                # Either a hole too big to read through, or a max_read_bytes split.
                assert (hole > 0 and hole >= cfg.gap_limit_bytes) or \
                    (hole == 0 and prev.length == cfg.max_read_bytes)
            if prev is not None:
                assert (prev.file_id, prev.file_offset) < (op.file_id, op.file_offset)
            prev = op
        if cfg.max_read_bytes == 64 << 20:
            assert len(lp.ssd_ops) <= sum(1 for r in runs if r.segment.medium == Medium.SSD)
        assert w.execute(plan, lp.layer, total) == w.expected(runs, lp.layer)
