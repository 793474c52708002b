"""A request the engine already holds in its own prefix cache, and a step with nothing
to do: what the scheduler half does for them (counted, never timed)."""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path

from flatcake.clock import ManualClock
from flatcake.control.scheduler import MasScheduler
from tests.connectors.sides_harness import Harness, stored_turn, tokens, view


def count_queue_calls(h: Harness) -> list[Hashable]:
    """The FC-MAS queues the scheduler half asks for from now on."""
    calls: list[Hashable] = []
    control = h.sched.control
    ask = control.restore_queue

    def counted(queue: Hashable = None) -> MasScheduler:
        calls.append(queue)
        return ask(queue)

    control.restore_queue = counted  # type: ignore[method-assign]
    return calls


def test_a_held_prompt_is_looked_up_and_never_stored_again(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    turn0 = stored_turn(h)  # 4 full blocks, durable on SSD
    stored = h.sched.totals()["stores_ok"]
    # The same prompt again, every block in the engine's own cache: nothing to load,
    # and nothing to store (FlatCake holds every block durably).
    v = view("again", turn0)
    assert h.sched.num_matched_tokens(v, 16) == (0, False)
    assert h.sched.prompt_computed(v, [9, 10, 11, 12, 13]) is None
    plan, _, _, _ = h.step()
    assert plan.loads == () and plan.stores == ()
    delay, _ = h.sched.request_finished(v)
    assert delay is False  # its blocks go back to the engine at once
    assert h.sched.totals()["stores_ok"] == stored
    h.close()


def test_a_step_with_nothing_queued_asks_fc_mas_nothing(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    stored_turn(h)
    calls = count_queue_calls(h)
    for _ in range(20):
        plan = h.sched.build_step()
        assert plan.loads == () and plan.stores == () and plan.drops == ()
    assert calls == []
    # An SSD hit queued for a restore: the next step asks its queue and starts it.
    v = view("b", [*range(100, 117), 1, 2, 3, 4])
    assert h.sched.num_matched_tokens(v, 0) == (16, True)
    h.sched.after_alloc("b", [20, 21, 22, 23, 24], 16)
    calls.clear()
    plan = h.sched.build_step()
    assert [t.request_id for t in plan.loads] == ["b"] and calls
    h.close()


def test_a_lookup_says_whether_the_whole_prompt_is_held_and_touches_its_session(
        tmp_path: Path) -> None:
    clock = ManualClock()
    h = Harness(tmp_path, clock=clock)
    turn0 = stored_turn(h)  # 4 full blocks + 1 token, session s
    touched = h.sched.control.session("s").last_access
    clock.advance(5.0)
    again = view("again", turn0, session="s")
    assert h.sched.num_matched_tokens(again, 16) == (0, False)
    assert h.sched.held_whole("again")  # its step would store nothing
    # ... so the lookup touches the session, as that store of nothing would.
    assert h.sched.control.session("s").last_access == touched + 5.0
    # A prompt of whole blocks: the lookup leaves its last token, so its last block,
    # to compute; that block is held too.
    exact = view("exact", turn0[:16], session="s")
    assert h.sched.num_matched_tokens(exact, 0) == (12, True)
    assert h.sched.held_whole("exact")
    longer = view("longer", tokens(turn0, 8, 200), session="s")
    assert h.sched.num_matched_tokens(longer, 0) == (16, True)
    assert not h.sched.held_whole("longer") and not h.sched.held_whole("nobody")
    h.close()
