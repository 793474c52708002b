"""Placement "not yet" (``placement.not_yet``, ``control.notyet``): a first turn with no
sign of reuse is homed in memory and written to the SSD only when its session
continues; nothing is served from a home that is gone."""

from __future__ import annotations

from flatcake.clock import ManualClock
from flatcake.control import ControlPlane, StorePlan
from flatcake.control.address import Medium
from flatcake.control.index import Segment
from flatcake.control.notyet import NotYet
from flatcake.control.placement import PlacementRule
from flatcake.control.sessions import SessionTable
from flatcake.control.wear import WearCounts
from tests.control.helpers import K, make, skeys


def _turn0(cp: ControlPlane, session: str, n: int) -> StorePlan:
    plan = cp.prepare_store(session, skeys(session, n), turn_index=0, context_tokens=4 * n)
    assert plan is not None
    cp.complete_store(plan, True)
    return plan


def _turn1(cp: ControlPlane, session: str, n: int) -> StorePlan | None:
    # A 600-token reply: neither short (512) nor long, so the DEFAULT rule: SSD.
    return cp.prepare_store(session, skeys(session, n), turn_index=1,
                            context_tokens=4 * n, prev_reply_tokens=600)


def test_a_first_turn_is_not_written_until_its_session_continues() -> None:
    cp, _ = make(not_yet=True)
    home = _turn0(cp, "a", 3)
    assert (home.medium, home.placement.rule) == (Medium.MEMORY, PlacementRule.NOT_YET)
    assert cp.ssd_wear() == WearCounts(0, 0, 0, 0)
    hit = cp.lookup(skeys("a", 3))
    assert (hit.num_blocks, hit.num_memory_blocks) == (3, 3)
    plan = _turn1(cp, "a", 5)
    assert plan is not None and plan.medium == Medium.SSD
    # The SSD segment starts at the not-yet turn: its 3 blocks and the 2 new ones.
    assert plan.first_block == 0 and plan.segment.keys == tuple(skeys("a", 5))
    # Until the write is durable the memory home serves.
    assert cp.lookup(skeys("a", 3)).num_memory_blocks == 3
    cp.complete_store(plan, True)
    hit = cp.lookup(skeys("a", 5))
    assert (hit.num_blocks, hit.num_ssd_blocks) == (5, 5)
    assert cp.memory_used_bytes == 0 and cp.stats().num_memory_segments == 0
    w = plan.segment.total_bytes
    assert cp.ssd_wear() == WearCounts(w, 0, 0, w)
    cp.check_integrity()


def test_off_a_first_turn_goes_to_the_ssd_at_once() -> None:
    cp, _ = make()
    plan = _turn0(cp, "a", 3)
    assert (plan.medium, plan.placement.rule) == (Medium.SSD, PlacementRule.FIRST_TURN)
    assert cp.ssd_wear().written_bytes == plan.segment.total_bytes


def test_a_session_that_never_continues_costs_no_ssd_wear() -> None:
    cp, _ = make(not_yet=True)
    for s in ("a", "b", "c"):
        _turn0(cp, s, 2)
    cp.drop_session("b")
    assert cp.ssd_wear() == WearCounts(0, 0, 0, 0)


def test_a_home_dropped_before_the_continuation_is_a_miss_then_written_whole() -> None:
    cp, _ = make(not_yet=True)
    _turn0(cp, "a", 3)
    cp.drop_session("a")  # e.g. memory reclaim took it
    assert cp.lookup(skeys("a", 5)).num_blocks == 0  # a miss, never wrong bytes
    plan = _turn1(cp, "a", 5)
    assert plan is not None and plan.first_block == 0 and plan.segment.num_blocks == 5
    cp.complete_store(plan, True)
    assert cp.lookup(skeys("a", 5)).num_ssd_blocks == 5
    cp.check_integrity()


def test_a_home_being_restored_is_freed_only_after_the_restore() -> None:
    cp, _ = make(not_yet=True)
    _turn0(cp, "a", 3)
    lp = cp.prepare_load("r", skeys("a", 3))
    assert lp.hit.num_memory_blocks == 3
    plan = _turn1(cp, "a", 5)
    assert plan is not None
    cp.complete_store(plan, True)
    # The restore still reads the home: it stays until nothing pins its session.
    assert cp.stats().num_memory_segments == 1
    cp.complete_load("r")
    other = _turn0(cp, "b", 1)  # the next store's completion frees it
    assert cp.stats().num_memory_segments == 1  # "b"'s own not-yet home only
    assert cp.lookup(skeys("a", 5)).num_ssd_blocks == 5
    assert other.placement.rule == PlacementRule.NOT_YET
    cp.check_integrity()


def test_an_agent_sized_or_shared_first_turn_is_not_deferred() -> None:
    cp, _ = make(not_yet=True)
    agent = cp.prepare_store("a", skeys("a", 2), turn_index=0, context_tokens=10**6)
    shared = cp.prepare_store("s", skeys("s", 2), turn_index=0, context_tokens=8,
                              shared_refcount=2)
    assert agent is not None and agent.placement.rule == PlacementRule.FIRST_TURN
    assert shared is not None and shared.placement.rule == PlacementRule.SHARED_PREFIX


# -- written back at reclaim (``placement.not_yet_write_back``) -------------------------


def _homes(cp: ControlPlane, clock: ManualClock, sessions: str, n: int = 8) -> None:
    """A not-yet first turn of ``n`` blocks (one 4 KiB page) per session, a second apart."""
    for s in sessions:
        assert _turn0(cp, s, n).placement.rule == PlacementRule.NOT_YET
        clock.advance(1.0)


def test_reclaim_writes_a_live_not_yet_home_to_the_ssd_rather_than_drop_it() -> None:
    # 8 pages of memory, reclaim from 0.9 down to 0.5: the 8th home crosses the high
    # watermark and the 4 oldest homes go to the SSD (4 pages left).
    cp, clock = make(memory_pages=8, not_yet=True, write_back=True)
    _homes(cp, clock, "abcdefg")
    _homes(cp, clock, "h")
    backs = cp.take_write_backs()
    assert [(p.session_id, p.medium, p.first_block, p.segment.num_blocks) for p in backs] \
        == [(s, Medium.SSD, 0, 8) for s in "abcd"]
    # Until a write-back is durable its home serves.
    assert cp.lookup(skeys("a", 8)).num_memory_blocks == 8
    assert cp.ssd_wear().written_bytes == 0
    for p in backs:
        cp.complete_store(p, True)
    for s in "abcd":
        hit = cp.lookup(skeys(s, 8))
        assert (hit.num_blocks, hit.num_ssd_blocks) == (8, 8)
    for s in "efgh":
        assert cp.lookup(skeys(s, 8)).num_memory_blocks == 8
    assert cp.memory_used_bytes == 4 * K
    assert cp.stats().sessions_reclaimed_memory == 0
    assert cp.ssd_wear().written_bytes == sum(p.segment.total_bytes for p in backs)
    # The next turn of a written-back session stores only its new blocks.
    plan = _turn1(cp, "a", 10)
    assert plan is not None and (plan.first_block, plan.segment.num_blocks) == (8, 2)
    cp.check_integrity()


def test_a_home_idle_past_the_bound_is_dropped_unwritten() -> None:
    cp, clock = make(memory_pages=8, not_yet=True, write_back=True, idle_s=10.0)
    _homes(cp, clock, "ab")
    clock.advance(100.0)
    _homes(cp, clock, "cdefg")
    _homes(cp, clock, "h")
    # a and b idle for over 100 s: dropped; c and d written back.
    backs = cp.take_write_backs()
    assert [p.session_id for p in backs] == ["c", "d"]
    assert cp.lookup(skeys("a", 8)).num_blocks == 0
    assert cp.lookup(skeys("b", 8)).num_blocks == 0
    assert cp.memory_used_bytes == 6 * K  # c and d until their writes are durable
    for p in backs:
        cp.complete_store(p, True)
    assert cp.memory_used_bytes == 4 * K
    assert cp.ssd_wear().written_bytes == sum(p.segment.total_bytes for p in backs)
    cp.check_integrity()


def test_an_agent_turns_memory_copy_outlives_the_not_yet_homes() -> None:
    cp, clock = make(memory_pages=8, copy_watermark=0.9, not_yet=True, write_back=True)
    agent = cp.prepare_store("x", skeys("x", 8), turn_index=0, context_tokens=10**6)
    assert agent is not None and agent.copy is not None
    cp.complete_store(agent, True)
    clock.advance(1.0)
    _homes(cp, clock, "abcdefg")  # the 7th crosses the high watermark
    assert [p.session_id for p in cp.take_write_backs()] == ["a", "b", "c", "d"]
    hit = cp.lookup(skeys("x", 8))
    assert (hit.num_blocks, hit.num_memory_blocks) == (8, 8)  # served from its copy
    assert cp.stats().memory_copies_dropped == 0


def test_a_host_that_does_not_write_back_refuses_the_key() -> None:
    """``placement.not_yet_write_back`` on a host built without ``write_backs`` (the
    store, the vLLM connector, the node service) is refused by name, never ignored."""
    import pytest

    from flatcake.config import FlatCakeConfig, PlacementConfig
    from tests.control.helpers import GEOM

    cfg = FlatCakeConfig(placement=PlacementConfig(not_yet=True, not_yet_write_back=True))
    with pytest.raises(ValueError, match=r"placement\.not_yet_write_back"):
        ControlPlane(GEOM, cfg, ManualClock())
    ControlPlane(GEOM, cfg, ManualClock(), write_backs=True)  # the replay's


def test_not_yet_knows_which_stores_write_a_home_back() -> None:
    """One book of the write-backs in flight: ``NotYet`` says which stores they are
    (``Stores`` asks it when one completes), until the store settles."""
    cp, clock = make(memory_pages=8, not_yet=True, write_back=True)
    _homes(cp, clock, "abcdefgh")
    backs = cp.take_write_backs()
    ny = NotYet(cp.index, cp.arena, SessionTable(cp.ssd))
    seg = cp.index.segment(cp.session("e").memory_segment_ids[0])
    ny.cover_home(backs[0].segment.segment_id, seg)
    assert ny.writes_back(backs[0].segment.segment_id)
    assert not ny.writes_back(backs[1].segment.segment_id)
    ny.settle(backs[0].segment.segment_id, False)
    assert not ny.writes_back(backs[0].segment.segment_id)
    # A write-back's completion is no access of its session (so reclaim's order holds).
    before = cp.session("a").last_access
    clock.advance(50.0)
    cp.complete_store(backs[0], True)
    assert cp.session("a").last_access == before


def test_reclaim_writes_back_through_the_verb_and_clock_it_is_built_with() -> None:
    """``Reclaimer`` takes the not-yet homes, the write-back verb and the clock when it is
    made: homes idle past ``placement.not_yet_idle_s`` by that clock are dropped, the
    others handed to that verb."""
    from flatcake.config import FlatCakeConfig, PlacementConfig, ReclaimConfig, StoreConfig
    from flatcake.control.reclaimer import Reclaimer

    cp, clock = make(memory_pages=8, not_yet=True)
    _homes(cp, clock, "ab")  # last access at 0 s and 1 s
    cfg = FlatCakeConfig(
        placement=PlacementConfig(not_yet=True, not_yet_idle_s=10.0),
        store=StoreConfig(memory_capacity_bytes=8 * K),
        reclaim=ReclaimConfig(memory_high=0.9, memory_low=0.5))
    for now, written, dropped in ((5.0, ["a", "b"], 0), (100.0, [], 2)):
        ny = NotYet(cp.index, cp.arena, cp._sessions)  # the plane's homes, booked anew
        for s in "ab":
            ny.placed(cp.index.segment(cp.session(s).memory_segment_ids[0]), 0)
        calls: list[str] = []

        def write(seg: Segment, first: int, calls: list[str] = calls) -> bool:
            calls.append(seg.session_id)
            return True

        def clock_now(now: float = now) -> float:
            return now

        r = Reclaimer(cfg, cp.index, cp.arena, cp.ssd, cp.copies, cp._sessions, cp._spare,
                      cp._damage, [], {}, {}, not_yet=ny, write_back=write, now=clock_now)
        # Memory use of 8 pages; the low watermark is 4: both homes go.
        r.reclaim_not_yet(8 * K)
        assert (calls, ny.num_dropped) == (written, dropped)


def test_a_home_still_being_written_at_reclaim_is_written_back_later() -> None:
    """A host that writes a memory home after ``prepare_store`` (the vLLM connector's
    workers, a step later): a reclaim while it is in flight skips it (its session is
    pinned) and keeps it a not-yet home, so a later reclaim writes it back."""
    cp, clock = make(memory_pages=8, not_yet=True, write_back=True)
    a = cp.prepare_store("a", skeys("a", 8), turn_index=0, context_tokens=32)
    assert a is not None and a.placement.rule == PlacementRule.NOT_YET
    clock.advance(1.0)
    _homes(cp, clock, "bcdefgh")  # the 8th page crosses the high watermark
    backs = cp.take_write_backs()
    assert [p.session_id for p in backs] == ["b", "c", "d", "e"]  # "a" is pinned
    cp.complete_store(a, True)
    for p in backs:
        cp.complete_store(p, True)
    _homes(cp, clock, "ijkl")  # f, g, h, a (written last), i, j, k, l: 8 pages again
    assert [p.session_id for p in cp.take_write_backs()] == ["f", "g", "h", "a"]
    cp.check_integrity()
