"""The books' side of window rows at branch points (``store.window_rows``): where a
prompt branches off a stored prefix that holds no window, its segment starts a window
before the branch and keeps that window's rows too (``layout``'s ``ends``); a host that
no longer holds those rows (``rows_from``) gets a turn-end segment; a restore ending in
such a segment reads the window at its end only; ``every-block`` keeps rows
everywhere; ``window_row_stride_tokens`` keeps them at every multiple of the stride."""

from __future__ import annotations

import pytest

from flatcake.clock import ManualClock
from flatcake.config import FlatCakeConfig, PlacementConfig, StoreConfig
from flatcake.control import ControlPlane
from flatcake.control.windows import restore_view
from flatcake.geometry import KVGeometry, LayerGroup
from flatcake.layout import ALIGN, SegmentLayout
from flatcake.plan.bulk import plan_totals
from flatcake.plan.reads import plan_reads
from tests.control.helpers import skeys

# One full layer (8 KiB a block) and two sliding layers of 2 blocks (8 KiB a block).
G = KVGeometry(num_layers=3, tokens_per_block=16, dtype="uint8", name="branch",
               groups=(LayerGroup(1, 512, kind="full"),
                       LayerGroup(2, 512, window_tokens=32, kind="sliding")))
BLOCK = 8192


def plane(rows: str = "branches", stride: int = 0, dense: int = 0) -> ControlPlane:
    cfg = FlatCakeConfig(placement=PlacementConfig(memory_copy_watermark=0.0),
                         store=StoreConfig(memory_capacity_bytes=1 << 20,
                                           ssd_capacity_bytes=1 << 26,
                                           session_file_bytes=1 << 24, window_rows=rows,
                                           window_row_stride_tokens=stride,
                                           window_row_stride_dense_tokens=dense))
    return ControlPlane(G, cfg, ManualClock(), planner=plan_reads, release_windows=True)


def stored(cp: ControlPlane, session: str, ks: list[bytes], rows_from: int = 0
           ) -> tuple[int, int, tuple[tuple[int, int], ...]]:
    """Store ``ks`` as turn 0 of ``session``: (first block, blocks, hit ends)."""
    plan = cp.prepare_store(session, ks, turn_index=0, context_tokens=0,
                            rows_from=rows_from)
    assert plan is not None
    cp.complete_store(plan, True)
    return plan.first_block, plan.segment.num_blocks, plan.segment.layout.ends


def test_a_branch_keeps_the_window_before_it_and_serves_hits_ending_there() -> None:
    cp = plane()
    shared = skeys("sys", 6)
    a, b, c = shared + skeys("a", 4), shared + skeys("b", 5), shared + skeys("c", 3)
    assert stored(cp, "a", a) == (0, 10, ())
    assert cp.lookup(b).num_blocks == 0  # no window held at the branch (block 6)
    assert stored(cp, "b", b) == (4, 7, ((2, 2),))
    seg = max(cp.segments(), key=lambda s: s.segment_id)
    # Rows of the window before the branch (segment blocks 0-1) and at the end (5-6).
    assert seg.layout.layer_runs(1) == ((0, 2), (5, 7))
    assert seg.layout.layer_rows(1) == 4
    for end, served in ((6, 6), (8, 6), (11, 11)):
        assert cp.lookup(b[:end]).num_blocks == served
    assert cp.lookup(c).num_blocks == 6  # a third prompt sharing the prefix
    assert cp.lookup(a).num_blocks == 10
    # A restore of b's 11 blocks reads its sliding layers' window (blocks 9-10) only,
    # not every row from the branch on (blocks 6-10 of the run in b's segment).
    load = cp.prepare_load("r", b)
    assert load.hit.num_blocks == 11
    assert load.read_plan.useful_bytes == (11 + 2 * 2) * BLOCK
    view = restore_view(load.hit.runs)
    assert plan_totals(view, 3).useful_bytes == load.read_plan.useful_bytes
    cp.complete_load("r")
    cp.check_integrity()


def test_a_host_without_the_rows_at_the_branch_writes_a_turn_end_segment() -> None:
    cp = plane()
    shared = skeys("sys", 6)
    stored(cp, "a", shared + skeys("a", 4))
    # The engine computed this prompt from block 5 on: it no longer holds the rows of
    # the window before the branch (blocks 4-5) in its sliding layers.
    assert stored(cp, "b", shared + skeys("b", 5), rows_from=5) == (6, 5, ())
    assert cp.lookup(shared + skeys("c", 3)).num_blocks == 0


@pytest.mark.parametrize(("rows", "hit"), [("turn-ends", 0), ("every-block", 4)])
def test_the_other_rules(rows: str, hit: int) -> None:
    cp = plane(rows)
    shared = skeys("sys", 6)
    first = stored(cp, "a", shared + skeys("a", 4))
    assert first == ((0, 10, ((1, 9),)) if rows == "every-block" else (0, 10, ()))
    assert cp.lookup(shared[:4] + skeys("x", 2)).num_blocks == hit


def test_a_newer_turn_keeps_the_rows_of_a_branch_it_supersedes() -> None:
    cfg = FlatCakeConfig(placement=PlacementConfig(memory_copy_watermark=0.0),
                         store=StoreConfig(memory_capacity_bytes=1 << 20,
                                           ssd_capacity_bytes=1 << 26,
                                           session_file_bytes=1 << 24,
                                           release_windows_at_once=True,
                                           window_rows="branches"))
    cp = ControlPlane(G, cfg, ManualClock(), planner=plan_reads, release_windows=True)
    shared = skeys("sys", 6)
    stored(cp, "a", shared + skeys("a", 4))
    b = shared + skeys("b", 5)
    assert stored(cp, "b", b)[2] == ((2, 2),)
    plan = cp.prepare_store("b", b + skeys("b2", 4), turn_index=1, context_tokens=0)
    assert plan is not None
    cp.complete_store(plan, True)
    # b's first turn is superseded by its second, but other sessions end at its branch.
    assert all(not s.layout.released for s in cp.segments())
    assert cp.lookup(shared + skeys("c", 3)).num_blocks == 6


def test_a_stride_keeps_windows_at_its_multiples_of_request_blocks() -> None:
    """``window_row_stride_tokens``: rows at every multiple of the stride (64 tokens: 4
    blocks of 16), counted in request blocks (so prompts sharing a prefix find them at
    the same places), only where the engine still holds the window (``rows_from``); a
    hit ending between them is cut back to the last one; a restore reads the window at
    its end only."""
    cp = plane("turn-ends", stride=64)
    a = skeys("a", 11)
    assert stored(cp, "a", a) == (0, 11, ((4, 4), (8, 8)))
    seg = next(iter(cp.segments()))
    assert seg.layout.layer_runs(1) == ((2, 4), (6, 8), (9, 11))
    for end, served in ((3, 0), (4, 4), (7, 4), (8, 8), (10, 8), (11, 11)):
        assert cp.lookup(a[:end] + skeys("x", 2)).num_blocks == served, end
    # A restore ending at block 8 reads blocks 6-7 of the sliding layers.
    load = cp.prepare_load("r", a[:8] + skeys("x", 2))
    assert load.hit.num_blocks == 8
    assert load.read_plan.useful_bytes == (8 + 2 * 2) * BLOCK
    view = restore_view(load.hit.runs)
    assert plan_totals(view, 3).useful_bytes == load.read_plan.useful_bytes
    cp.complete_load("r")
    # Stride points whose window the engine no longer holds are left out.
    cp2 = plane("turn-ends", stride=64)
    assert stored(cp2, "b", skeys("b", 11), rows_from=5) == (0, 11, ((8, 8),))
    # A second turn keeps counting from the request's first block.
    plan = cp.prepare_store("a", a + skeys("a2", 6), turn_index=1, context_tokens=0)
    assert plan is not None and plan.first_block == 11
    assert plan.segment.layout.ends == ((1, 1), (5, 5))  # request blocks 12 and 16
    cp.complete_store(plan, True)
    cp.check_integrity()


def test_a_growing_stride_keeps_rows_near_the_end_and_few_far_from_it() -> None:
    """``window_row_stride_dense_tokens``: the stride points less than that many tokens
    before the turn's end are all kept, further back the spacing doubles there and at
    each doubling of the distance (still multiples of the stride counted from the
    request's first block); a hit ending at a dropped point is cut back to the kept one
    before it."""
    a = skeys("a", 40)
    assert stored(plane("turn-ends", stride=64), "e", a)[2] == tuple(
        (e, e) for e in range(4, 40, 4))
    cp = plane("turn-ends", stride=64, dense=256)  # 16 blocks
    # Distances from the end 4, 8, 12 (stride 4), 16 and 24 (spacing 8), 32 and 36
    # (spacing 16: blocks 8 and 4 are no multiples of 16; block 0 is no hit end).
    assert stored(cp, "a", a) == (0, 40, ((16, 16), (24, 24), (28, 28), (32, 32),
                                          (36, 36)))
    for end, served in ((8, 0), (15, 0), (16, 16), (20, 16), (24, 24), (37, 36),
                        (40, 40)):
        assert cp.lookup(a[:end] + skeys("x", 2)).num_blocks == served, end
    # A second turn counts its distances from its own end, its points from block 0.
    plan = cp.prepare_store("a", a + skeys("a2", 10), turn_index=1, context_tokens=0)
    assert plan is not None and plan.first_block == 40
    assert plan.segment.layout.ends == ((4, 4), (8, 8))  # request blocks 44 and 48
    cp.complete_store(plan, True)
    cp.check_integrity()


def test_a_turn_whose_rows_would_pass_the_file_span_keeps_its_end_window_only() -> None:
    """Rows at hit ends are an option: a turn they would push past one session file's
    span (``store.session_file_bytes``) is written with the window at its end only,
    not refused."""
    plain = SegmentLayout.for_ssd(11, G.layer_block_bytes, G.layer_window_blocks)
    strided = SegmentLayout.for_ssd(11, G.layer_block_bytes, G.layer_window_blocks,
                                    ends=((4, 4), (8, 8)))
    assert strided.total_bytes > plain.total_bytes
    cfg = FlatCakeConfig(placement=PlacementConfig(memory_copy_watermark=0.0),
                         store=StoreConfig(memory_capacity_bytes=1 << 20,
                                           ssd_capacity_bytes=1 << 26,
                                           session_file_bytes=ALIGN + plain.total_bytes,
                                           window_rows="turn-ends",
                                           window_row_stride_tokens=64))
    cp = ControlPlane(G, cfg, ManualClock(), planner=plan_reads, release_windows=True)
    a = skeys("a", 11)
    assert stored(cp, "a", a) == (0, 11, ())
    assert cp.lookup(a).num_blocks == 11
    assert cp.lookup(a[:8] + skeys("x", 2)).num_blocks == 0  # no rows at block 8
    cp.check_integrity()
