"""Placement signals (``control.signals``): who owns a hit's end, deterministic session
names, and the live refcount of a shared prefix."""

from __future__ import annotations

import itertools

import pytest

from flatcake.control.signals import HitOwner, PrefixRefcount, SessionTracker, hit_owner
from tests.control.helpers import first_turn, make, skeys


def test_hit_owner_names_the_session_and_its_newest_turn() -> None:
    cp, _ = make()
    first_turn(cp, "chat", 2)
    plan = cp.prepare_store("chat", skeys("chat", 5), turn_index=1, context_tokens=20,
                            prev_reply_tokens=50)
    assert plan is not None
    cp.complete_store(plan, True)
    assert hit_owner(cp, cp.lookup(skeys("chat", 5))) == HitOwner("chat", True, 2, 1)
    # A hit ending in the first turn's segment does not reach the newest one.
    assert hit_owner(cp, cp.lookup(skeys("chat", 2))) == HitOwner("chat", False, 2, 0)
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


def test_branches_join_their_session_up_to_the_cap_then_its_heirs() -> None:
    ids = itertools.count()
    t = SessionTracker(new_session_id=lambda: f"auto-{next(ids)}", max_branch_blocks=4)
    root = t.resolve(None, 0, None)
    t.finish_turn(root, reply_tokens=10, prompt_blocks=8)
    owner = HitOwner(root.session_id, False, 1)
    # Unrelated users behind the root's 6-block system prompt, 3-block tails each.
    homes = []
    for _ in range(5):
        turn = t.resolve(None, 6, owner)
        assert turn.branch_point == 6 and turn.prev_reply_tokens is None
        t.finish_turn(turn, reply_tokens=10, prompt_blocks=9)
        homes.append((turn.session_id, turn.turn_index))
    # The root takes 2 tails (3, then 6 >= 4 blocks); its heir the next 2; then the
    # heir's heir. An heir's first tail is its first turn.
    assert homes == [("auto-0", 1), ("auto-0", 2), ("auto-1", 0), ("auto-1", 1),
                     ("auto-2", 0)]
    # A user going on from a whole branch turn starts a conversation of its own.
    cont = t.resolve(None, 9, HitOwner("auto-1", True, 2, 1))
    assert (cont.session_id, cont.turn_index, cont.prev_reply_tokens,
            cont.branch_point) == ("auto-3", 2, 10, None)
    t.finish_turn(cont, reply_tokens=30, prompt_blocks=12)
    nxt = t.resolve(None, 12, HitOwner("auto-3", True, 3, 2))
    assert (nxt.session_id, nxt.turn_index, nxt.prev_reply_tokens) == ("auto-3", 3, 30)


def test_a_request_after_an_older_turn_is_a_branch_with_that_turns_reply() -> None:
    t = SessionTracker()
    turns = []
    for i, (prompt_blocks, reply) in enumerate([(4, 100), (8, 200)]):
        turn = t.resolve(None, 0 if i == 0 else 4, None if i == 0 else HitOwner(
            turns[0].session_id, True, 1, 0))
        t.finish_turn(turn, reply_tokens=reply, prompt_blocks=prompt_blocks)
        turns.append(turn)
    sid = turns[0].session_id
    assert turns[1].session_id == sid and turns[1].turn_index == 1
    # A retry of turn 1: turn 0's whole prompt, then another message.
    retry = t.resolve(None, 4, HitOwner(sid, False, 2, 0))
    assert (retry.session_id, retry.turn_index, retry.prev_reply_tokens,
            retry.branch_point) == (sid, 2, 100, 4)
    # The latest turn, covered whole, is continued.
    cont = t.resolve(None, 8, HitOwner(sid, True, 2, 1))
    assert (cont.session_id, cont.prev_reply_tokens, cont.branch_point) == (sid, 200, None)


def test_a_zero_cap_makes_each_branch_a_session_of_its_own() -> None:
    t = SessionTracker(max_branch_blocks=0)
    root = t.resolve(None, 0, None)
    t.finish_turn(root, reply_tokens=10, prompt_blocks=8)
    owner = HitOwner(root.session_id, False, 1)
    seen = set()
    for _ in range(3):
        turn = t.resolve(None, 6, owner)
        t.finish_turn(turn, reply_tokens=10, prompt_blocks=7)
        seen.add(turn.session_id)
    assert len(seen) == 3 and root.session_id not in seen
    with pytest.raises(ValueError, match="max_branch_blocks"):
        SessionTracker(max_branch_blocks=-1)


def test_a_store_in_parts_stays_with_its_branch_up_to_the_cap() -> None:
    """``turns_in_parts`` (SGLang: a request's prompt, then its reply, as two stores
    naming no request): a store starting where a branch's store ended is more of that
    branch's tail, not a conversation of its own; past the cap it goes to the heir."""
    ids = itertools.count()
    t = SessionTracker(new_session_id=lambda: f"auto-{next(ids)}", max_branch_blocks=3,
                       turns_in_parts=True)
    root = t.resolve(None, 0, None)
    t.finish_turn(root, reply_tokens=None, prompt_blocks=8)
    branch = t.resolve(None, 6, HitOwner("auto-0", False, 1, 0))
    assert (branch.session_id, branch.turn_index, branch.branch_point) == ("auto-0", 1, 6)
    t.finish_turn(branch, reply_tokens=None, prompt_blocks=7)
    homes = []
    for turn_index, end in enumerate((7, 8, 9), start=1):  # its reply, then its next turns
        part = t.resolve(None, end, HitOwner(homes[-1][0] if homes else "auto-0", True,
                                             turn_index + 1, turn_index))
        assert part.branch_point == end and part.prev_reply_tokens is None
        t.finish_turn(part, reply_tokens=None, prompt_blocks=end + 1)
        homes.append((part.session_id, part.turn_index))
    # Tails of 1 + 1 + 1 blocks fill the cap of 3; the next part goes to the heir.
    assert homes == [("auto-0", 2), ("auto-0", 3), ("auto-1", 0)]
    with pytest.raises(ValueError, match="reply_tokens"):
        t.finish_turn(part, reply_tokens=-1, prompt_blocks=1)
