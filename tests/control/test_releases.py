"""The books' side of releasing superseded window rows (``control.releases``): which
segments a newer turn supersedes, that they stay until the SSD needs the space (or go
at once with ``release_windows_at_once``), that lookups stop there at once, that the punch
waits for a restore in flight that was planned with the rows, and that the SSD budget
counts what the files still hold."""

from __future__ import annotations

from flatcake.clock import ManualClock
from flatcake.config import FlatCakeConfig, PlacementConfig, StoreConfig
from flatcake.control import ControlPlane
from flatcake.geometry import KVGeometry, LayerGroup
from flatcake.plan.reads import plan_reads
from tests.control.helpers import skeys

# One full layer (8 KiB a block) and two sliding layers of 2 blocks (8 KiB a block).
G = KVGeometry(num_layers=3, tokens_per_block=16, dtype="uint8", name="rel",
               groups=(LayerGroup(1, 512, kind="full"),
                       LayerGroup(2, 512, window_tokens=32, kind="sliding")))


def plane(release: bool = True) -> ControlPlane:
    # No memory copies: a copy keeps its rows, and would serve in the home's place.
    cfg = FlatCakeConfig(placement=PlacementConfig(memory_copy_watermark=0.0),
                         store=StoreConfig(memory_capacity_bytes=1 << 20,
                                           ssd_capacity_bytes=1 << 26,
                                           session_file_bytes=1 << 24,
                                           release_old_windows=release,
                                           release_windows_at_once=True))
    return ControlPlane(G, cfg, ManualClock(), planner=plan_reads, release_windows=True)


def store(cp: ControlPlane, session: str, ks: list[bytes], turn: int) -> None:
    plan = cp.prepare_store(session, ks, turn_index=turn, context_tokens=0)
    assert plan is not None and plan.medium.name == "SSD"
    cp.complete_store(plan, True)


def test_a_newer_turn_releases_the_older_windows_after_the_restores_reading_them() -> None:
    cp = plane()
    ks = skeys("a", 12)
    store(cp, "a", ks[:4], 0)
    load = cp.prepare_load("r", ks[:4])  # planned with turn 0's window rows
    assert load.hit.num_blocks == 4
    store(cp, "a", ks[:8], 1)
    first = next(iter(cp.segments()))
    assert first.layout.released == (1, 2)
    assert cp.lookup(ks[:4]).num_blocks == 0  # at once: its window is not served
    assert cp.lookup(ks[:8]).num_blocks == 8
    assert cp.take_window_releases() == []  # the restore in flight still reads them
    cp.complete_load("r")
    (rel,) = cp.take_window_releases()
    assert (rel.segment_id, rel.file_id) == (first.segment_id, first.file_id)
    assert first.file_offset is not None
    lay = first.layout
    lo = first.file_offset + lay.layer_offset(1)
    assert rel.pages == ((lo, lo + 2 * 2 * 8192),)  # both sliding layers: adjacent
    assert cp.stats().window_bytes_released == rel.bytes
    assert cp.take_window_releases() == []
    cp.check_integrity()


def test_only_the_same_sessions_turns_run_through_to_their_end_are_released() -> None:
    cp = plane()
    ks = skeys("a", 12)
    store(cp, "a", ks[:6], 0)
    store(cp, "b", ks[:10], 0)  # another session continues a's turn: a's window stays
    store(cp, "a", ks[:3] + skeys("c", 5), 1)  # a branch inside turn 0: nothing released
    assert [s.layout.released for s in cp.segments()] == [(), (), ()]
    assert cp.take_window_releases() == []
    for off in (plane(release=False), ControlPlane(G, plane().config, ManualClock())):
        # Off, or a host that punches nothing (the default): every window kept.
        store(off, "a", ks[:4], 0)
        store(off, "a", ks[:8], 1)
        assert [s.layout.released for s in off.segments()] == [(), ()]
        assert off.lookup(ks[:4]).num_blocks == 4


def test_the_ssd_budget_counts_what_the_files_still_hold() -> None:
    cp = plane()
    ks = skeys("a", 12)
    store(cp, "a", ks[:4], 0)
    store(cp, "a", ks[:8], 1)
    store(cp, "a", ks[:12], 2)
    first, second, _ = sorted(cp.segments(), key=lambda s: s.segment_id)
    assert first.layout.released == second.layout.released == (1, 2)
    segs = sum(s.total_bytes for s in cp.segments())
    # Two turns' window rows (2 layers x 2 blocks x 8 KiB each) no longer count.
    assert cp.stats().ssd_used_bytes == 4096 + segs - 2 * (2 * 2 * 8192)
    assert len(cp.take_window_releases()) == 2
    cp.check_integrity()  # each session's bytes match the budget
    cp.drop_session("a")  # reclaim gives back what was still counted, no more
    assert cp.stats().ssd_used_bytes == 0
    cp.check_integrity()


def test_a_write_after_a_cut_never_lands_on_a_range_a_release_was_handed_for() -> None:
    # Two engines on one node's books: engine A's step takes turn 1's release (its
    # workers punch it when they start that step); before they do, engine B's load
    # finds turn 1 damaged, the cut gives the file's tail back, and B's next store of
    # the session is placed. It must not land on the range A is about to punch.
    cp = plane()
    ks = skeys("a", 16)
    store(cp, "a", ks[:4], 0)
    store(cp, "a", ks[:8], 1)
    store(cp, "a", ks[:12], 2)
    first, second, _ = sorted(cp.segments(), key=lambda s: s.segment_id)
    handed = cp.take_window_releases()  # engine A's step
    assert {r.segment_id for r in handed} == {first.segment_id, second.segment_id}
    assert cp.mark_damaged(second.segment_id)  # engine B's load
    (action,) = cp.settle_damage()
    assert [s.segment_id for s in action.ssd_segments] == [second.segment_id, second.segment_id + 1]
    plan = cp.prepare_store("a", ks[:16], turn_index=3, context_tokens=0)  # engine B
    assert plan is not None and plan.segment.file_offset is not None
    seg = plan.segment
    lo, hi = seg.file_offset, seg.file_offset + seg.total_bytes
    for rel in handed:
        if rel.file_id == seg.file_id:
            assert all(b <= lo or a >= hi for a, b in rel.pages), (rel, lo, hi)
    cp.complete_store(plan, True)
    cp.check_integrity()


def test_superseded_rows_stay_until_the_ssd_needs_their_space() -> None:
    # The default: a newer turn supersedes the older turns' rows, they stay where they
    # are (a hit ending at an older turn keeps its window), and a store that would
    # cross the SSD high watermark (0.9 x 400,000 B) releases them, oldest first,
    # before any session is dropped. Each turn: 4 blocks, its 2 sliding rows 32 KiB.
    cfg = FlatCakeConfig(placement=PlacementConfig(memory_copy_watermark=0.0),
                         store=StoreConfig(memory_capacity_bytes=1 << 20,
                                           ssd_capacity_bytes=400_000,
                                           session_file_bytes=1 << 24))
    cp = ControlPlane(G, cfg, ManualClock(), planner=plan_reads, release_windows=True)
    ks = skeys("a", 24)
    for t in range(5):
        store(cp, "a", ks[:4 * (t + 1)], t)
    assert [s.layout.released for s in cp.segments()] == [()] * 5
    assert [cp.lookup(ks[:4 * k]).num_blocks for k in range(1, 6)] == [4, 8, 12, 16, 20]
    assert cp.stats().ssd_used_bytes == 352256 and cp.take_window_releases() == []
    store(cp, "a", ks, 5)  # 352,256 + 69,632 B: over the watermark
    # Down to the low watermark (320,000 B): four turns' rows (4 x 32,768 B) go, no
    # session is dropped, and the newest turn still serves every block.
    assert [s.layout.released for s in cp.segments()] == [(1, 2)] * 4 + [(), ()]
    assert cp.stats().sessions_reclaimed_ssd == 0
    assert cp.stats().ssd_used_bytes == 352256 + 69632 - 4 * 32768
    assert [r.segment_id for r in cp.take_window_releases()] == [0, 1, 2, 3]
    assert cp.lookup(ks[:16]).num_blocks == 0 and cp.lookup(ks[:20]).num_blocks == 20
    assert cp.lookup(ks).num_blocks == 24
    cp.check_integrity()
