"""Placement "not yet" (``placement.not_yet``, ``control.notyet``): a first turn with no
sign of reuse is homed in memory and written to the SSD only when its session
continues; nothing is served from a home that is gone."""

from __future__ import annotations

from flatcake.control import ControlPlane, StorePlan
from flatcake.control.address import Medium
from flatcake.control.placement import PlacementRule
from flatcake.control.wear import WearCounts
from tests.control.helpers import make, skeys


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
