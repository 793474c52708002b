"""Placement signals (``control.signals``): who owns a hit's end, deterministic session
names, and the live refcount of a shared prefix."""

from __future__ import annotations

import itertools

from flatcake.control.signals import HitOwner, PrefixRefcount, SessionTracker, hit_owner
from tests.control.helpers import first_turn, make, skeys


def test_hit_owner_names_the_session_and_its_newest_turn() -> None:
    cp, _ = make()
    first_turn(cp, "chat", 2)
    plan = cp.prepare_store("chat", skeys("chat", 5), turn_index=1, context_tokens=20,
                            prev_reply_tokens=50)
    assert plan is not None
    cp.complete_store(plan, True)
    assert hit_owner(cp, cp.lookup(skeys("chat", 5))) == HitOwner("chat", True, 2)
    # A hit ending in the first turn's segment does not reach the newest one.
    assert hit_owner(cp, cp.lookup(skeys("chat", 2))) == HitOwner("chat", False, 2)
    assert hit_owner(cp, cp.lookup(skeys("other", 3))) is None


def test_new_sessions_are_named_by_the_given_factory() -> None:
    ids = itertools.count()
    t = SessionTracker(new_session_id=lambda: f"auto-{next(ids)}")
    assert [t.resolve(None, 0, None).session_id for _ in range(3)] == [
        "auto-0", "auto-1", "auto-2"]


def test_refcount_counts_live_holders_only() -> None:
    rc = PrefixRefcount()
    a, b, c = (bytes([i]) * 32 for i in range(3))
    rc.add("r1", [a, b, c])
    rc.add("r2", [a, b])
    rc.add("r3", [a])
    assert [rc.refcount(k) for k in (a, b, c)] == [3, 2, 1] and len(rc) == 3
    assert [rc.refcount(k, i) for i, k in enumerate((a, b, c))] == [3, 2, 1]
    rc.add("r1", [a])  # again: replaces its keys
    rc.remove("r2")
    rc.remove("never-added")
    assert [rc.refcount(k) for k in (a, b, c)] == [2, 0, 0] and len(rc) == 1
    assert rc.holds("r3") and not rc.holds("r2")
