"""The replay's bulk planner is tied to the planners the data path runs: ``plan_totals``
gives exactly ``plan_reads``' totals (commands, bytes, copies), and ``stream_totals``
(what the replay plans with) exactly those of the store's and the connector's
``StreamPlanner``, which reads an SSD segment over the span of its wanted blocks when it
has block crcs (format version 3) and whole otherwise (older segments)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flatcake.config import PlannerConfig
from flatcake.control.address import Medium, encode_address
from flatcake.control.index import HitRun, Segment
from flatcake.layout import SegmentLayout
from flatcake.plan.bulk import plan_totals, stream_totals
from flatcake.plan.reads import plan_reads
from flatcake.plan.stream import StreamPlanner
from flatcake.readplan import ReadPlan

FIELDS = ("num_blocks", "num_commands", "useful_bytes", "gap_bytes", "bytes_read",
          "num_copies", "memory_bytes")


def _key(i: int) -> bytes:
    return i.to_bytes(32, "big")


@st.composite
def hits(draw: st.DrawFn) -> tuple[list[HitRun], int, PlannerConfig]:
    num_layers = draw(st.integers(1, 5))
    sizes = st.sampled_from([512, 4096, 6144, 65536, 1000])
    if draw(st.booleans()):  # layers alike
        layer_sizes = (draw(sizes),) * num_layers
    else:  # layers of different sizes, some not multiples of 4 KiB
        layer_sizes = tuple(draw(sizes) for _ in range(num_layers))
    # Sliding-window layers (their segments hold the last blocks only), or none.
    windows = tuple(draw(st.sampled_from([0, 0, 1, 3])) for _ in range(num_layers)) \
        if draw(st.booleans()) else ()
    runs: list[HitRun] = []
    prefix = 0
    seg_id = 0
    key = 0
    arena = 0
    for file_id in range(draw(st.integers(0, 3))):
        offset = 4096
        for _ in range(draw(st.integers(1, 4))):
            n = draw(st.integers(1, 9))
            lay = SegmentLayout.for_ssd(n, layer_sizes, windows,
                                        block_crcs=draw(st.booleans()))
            if windows and any(windows) and draw(st.booleans()):
                # A newer turn released this segment's rows of one window.
                w = draw(st.sampled_from([w for w in windows if w]))
                lay = lay.release(tuple(k for k, kw in enumerate(windows) if kw == w))
            seg = Segment(seg_id, "s", Medium.SSD,
                          encode_address(Medium.SSD, 0, (file_id << 30) + offset), lay,
                          tuple(_key(key + j) for j in range(n)), 0, file_id, offset)
            seg_id += 1
            key += n
            offset += lay.total_bytes + draw(st.sampled_from([0, 4096, 1 << 20]))
            for _ in range(draw(st.sampled_from([0, 1, 1, 2]))):
                a = draw(st.integers(0, n - 1))
                b = draw(st.integers(a + 1, n))
                if any(r.segment is seg and a < r.start_pos + r.num_blocks
                       and r.start_pos < b for r in runs):
                    continue  # two runs never share a block
                runs.append(HitRun(seg, a, b - a, prefix))
                prefix += b - a
    for _ in range(draw(st.integers(0, 3))):
        n = draw(st.integers(1, 6))
        lay = SegmentLayout.for_memory(n, layer_sizes, windows)
        seg = Segment(seg_id, "s", Medium.MEMORY, encode_address(Medium.MEMORY, 0, arena),
                      lay, tuple(_key(key + j) for j in range(n)), 0)
        seg_id += 1
        key += n
        arena += lay.total_bytes + draw(st.sampled_from([0, 4096]))
        a = draw(st.integers(0, n - 1))
        runs.append(HitRun(seg, a, n - a, prefix))
        prefix += n - a
    cfg = PlannerConfig(gap_limit_bytes=draw(st.sampled_from([0, 4096, 65536, 1 << 22])),
                        max_read_bytes=draw(st.sampled_from([4096, 65536, 64 << 20])))
    order = draw(st.permutations(runs))
    return list(order), num_layers, cfg


@settings(max_examples=300, deadline=None)
@given(hits())
def test_totals_equal_plan_reads(case: tuple[list[HitRun], int, PlannerConfig]) -> None:
    runs, num_layers, cfg = case
    want = plan_reads(runs, num_layers, cfg)
    got = plan_totals(runs, num_layers, cfg)
    assert got.layers == ()
    _assert_same_totals(got, want)


@settings(max_examples=300, deadline=None)
@given(hits())
def test_stream_totals_equal_the_stream_planner(
        case: tuple[list[HitRun], int, PlannerConfig]) -> None:
    runs, num_layers, cfg = case
    want = StreamPlanner({})(runs, num_layers, cfg)
    got = stream_totals(runs, num_layers, cfg, segment_cache={})
    _assert_same_totals(got, want)
    # The same commands as the plan the store executes, op by op.
    assert want.num_commands == sum(len(lp.ssd_ops) for lp in want.layers)
    assert want.bytes_read == sum(op.length for lp in want.layers for op in lp.ssd_ops)


def _assert_same_totals(got: ReadPlan, want: ReadPlan) -> None:
    for field in FIELDS:
        assert getattr(got, field) == getattr(want, field), field
    if got.layer_commands:  # counted per layer for layers of different sizes
        assert got.layer_commands == tuple(len(lp.ssd_ops) for lp in want.layers)


def test_overlapping_runs_are_rejected_like_plan_reads() -> None:
    lay = SegmentLayout.for_ssd(4, (4096,) * 2)
    seg = Segment(0, "s", Medium.SSD, encode_address(Medium.SSD, 0, 4096), lay,
                  tuple(_key(j) for j in range(4)), 0, 0, 4096)
    runs = [HitRun(seg, 0, 3, 0), HitRun(seg, 2, 2, 3)]
    with pytest.raises(ValueError):
        plan_reads(runs, 2)
    with pytest.raises(ValueError):
        plan_totals(runs, 2)


def test_a_history_written_in_turns_restores_in_layers_times_turns_commands() -> None:
    # Three turns of one session, each segment read whole: per layer, the three ranges
    # are separated by the other layers (megabytes), so 4 layers x 3 turns commands.
    num_layers, bbpl = 4, 65536
    runs = []
    offset = 4096
    prefix = 0
    for t, n in enumerate((30, 5, 7)):
        lay = SegmentLayout.for_ssd(n, (bbpl,) * num_layers)
        seg = Segment(t, "s", Medium.SSD, encode_address(Medium.SSD, 0, offset), lay,
                      tuple(_key(100 * t + j) for j in range(n)), t, 0, offset)
        runs.append(HitRun(seg, 0, n, prefix))
        prefix += n
        offset += lay.total_bytes
    got = plan_totals(runs, num_layers)
    assert got.num_commands == num_layers * 3
    assert got.useful_bytes == 42 * num_layers * bbpl


def test_layers_of_three_sizes_restore_in_layers_times_turns_commands() -> None:
    # Three kinds of layer (one block of the last is not a multiple of 4 KiB): each
    # turn's segment is still one range per layer, so at most layers x turns commands,
    # and the bulk totals are the planner's.
    sizes = (65536,) * 2 + (22912,) * 3 + (584,) * 2
    runs, offset, prefix = [], 4096, 0
    for t, n in enumerate((9, 4, 6)):
        lay = SegmentLayout.for_ssd(n, sizes)
        seg = Segment(t, "s", Medium.SSD, encode_address(Medium.SSD, 0, offset), lay,
                      tuple(_key(100 * t + j) for j in range(n)), t, 0, offset)
        runs.append(HitRun(seg, 0, n, prefix))
        prefix += n
        offset += lay.total_bytes
    want = plan_reads(runs, len(sizes))
    assert want.num_commands <= len(sizes) * 3
    assert want.useful_bytes == 19 * sum(sizes)
    assert want.layers[6].ssd_ops[0].pieces[0].length == 9 * 584  # the 584 B layer
    _assert_same_totals(plan_totals(runs, len(sizes)), want)
