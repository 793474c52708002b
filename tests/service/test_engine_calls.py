"""The round trips an attached engine's scheduler half makes: a request's ``new_request``
goes with its lookup (one call for the two hooks), and when another call comes first it
goes alone just before it, so the service sees every request enter before anything
else the engine asks (its prompt tokens counted, its blocks in the shared-prefix
refcount); the store a step plans goes with the step; a request without a load
finishes without a call, the service learning of it with the next one, before what
that one asks. A new request is three calls: lookup, step, the workers' report. An
admitted hit goes with the next lookup or step (its sources are its lookup's), and a
request whose load ended finishes without a call (the update ending it answered its
params): a loaded hit is four calls, lookup, step, the load's report, the step computing
the rest of its prompt. A request whose lookup found its whole prompt held is left out
of the step computing it (nothing to store): held in vLLM's cache it is one call, its
lookup; loaded, three; loaded with fewer blocks than its hit, four again (the step
computing them may store them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flatcake.connectors.node_client import RemoteSchedulerSide
from flatcake.connectors.requests import RequestView
from flatcake.plan.tasks import FailedLoad, LoadDone, StoreDone, WorkerReport
from tests.connectors.sides_harness import finish, tokens, view
from tests.service.helpers import Engine, Service


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[Engine, list[str]]]:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock").start()
    e = Engine(svc.sock, seed=1)
    assert isinstance(e.sched, RemoteSchedulerSide)
    client = e.sched.client
    calls: list[str] = []
    call = client.call

    def counted(verb: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(verb.name)
        return call(verb, *args, **kwargs)

    client.call = counted  # type: ignore[method-assign,unused-ignore]
    try:
        yield e, calls
    finally:
        e.close()
        assert svc.stop() == 0, svc.stderr()


def test_a_new_request_and_its_lookup_are_one_call(engine: tuple[Engine, list[str]]
                                                   ) -> None:
    e, calls = engine
    first, second = view("r1", tokens([], 13, 100)), view("r2", tokens([], 9, 300))
    e.sched.new_request(first)
    e.sched.new_request(second)
    assert calls == []
    assert e.sched.num_matched_tokens(first, 0) == (0, False)
    assert calls == ["num_matched_tokens"]  # both requests entered with it
    assert e.sched.num_matched_tokens(second, 0) == (0, False)
    assert calls == ["num_matched_tokens"] * 2
    assert e.sched.take_stats()["prompt_tokens"] == 13 + 9


def test_a_call_before_the_lookup_sends_the_new_request_first(
        engine: tuple[Engine, list[str]]) -> None:
    e, calls = engine
    v = view("r1", tokens([], 13, 100))
    e.sched.new_request(v)
    delay, params = e.sched.request_finished(v)  # aborted while waiting: no lookup
    assert calls == [] and not delay and params is None  # the books never looked it up
    assert e.sched.take_stats()["prompt_tokens"] == 13
    assert calls == ["new_request", "request_finished", "take_stats"]


def test_a_new_request_is_three_calls(engine: tuple[Engine, list[str]]) -> None:
    e, calls = engine
    v = view("r1", tokens([], 13, 100), computed=13)
    e.sched.new_request(v)
    assert e.sched.num_matched_tokens(v, 0) == (0, False)
    plan = e.sched.build_step((), [(v, [0, 1, 2])])  # the step computing its prompt
    assert [t.request_id for t in plan.stores] == ["r1"]
    store = plan.stores[0].plan
    e.sched.on_report(WorkerReport(stores=(StoreDone("r1", store.segment.segment_id, True),)))
    assert e.sched.take_released([]) == []
    assert calls == ["num_matched_tokens", "step", "update"]
    delay, params = e.sched.request_finished(v)
    assert calls == ["num_matched_tokens", "step", "update"]  # answered by the engine
    assert delay and params is not None  # its blocks wait for the store's report
    assert params["flatcake"] == {
        "session_id": store.session_id, "turn_index": 0, "session_inferred": True,
        "hit_tokens": 0, "loaded_tokens_memory": 0, "loaded_tokens_ssd": 0,
        "load_error_blocks": 0, "stored_blocks": 3,
        "placement": f"{store.medium.name.lower()}:{store.placement.rule.value}"}


def test_a_finish_goes_with_the_next_call_before_what_it_asks(
        engine: tuple[Engine, list[str]]) -> None:
    e, calls = engine
    first = view("r1", tokens([], 5, 100), out=3, session="chat")
    e.sched.new_request(first)
    e.sched.num_matched_tokens(first, 0)
    assert e.sched.request_finished(first)[1]["flatcake"]["turn_index"] == 0  # type: ignore[index]
    second = view("r2", tokens([], 9, 100), session="chat")
    e.sched.new_request(second)
    e.sched.num_matched_tokens(second, 0)
    assert calls == ["num_matched_tokens"] * 2
    # The books learned the first turn finished before they looked up the second.
    _, params = e.sched.request_finished(second)
    assert params is not None and params["flatcake"]["turn_index"] == 1
    e.sched.build_step()  # the finish goes with the next step when nothing else calls
    assert calls == ["num_matched_tokens"] * 2 + ["step"]
    assert e.sched.take_stats()["prompt_tokens"] == 5 + 9


def _admitted(e: Engine, calls: list[str], external_tokens: int = 12
              ) -> tuple[RequestView, list[int]]:
    """Session ``s``'s first turn (3 full blocks + 1 token, slots 5-8) durable on SSD,
    then (the calls counted from here) its second turn ``b`` entered, looked up (an SSD
    hit of 12 tokens) and admitted with ``external_tokens`` into slots 20-24."""
    turn0 = list(range(100, 113))
    finish(e, "a", turn0, [5, 6, 7, 8], out=3, session="s")
    e.step()
    calls.clear()
    turn1 = tokens(turn0, 8, 200)
    v = view("b", turn1, session="s")
    e.sched.new_request(v)
    assert e.sched.num_matched_tokens(v, 0) == (12, True)
    e.sched.after_alloc("b", [20, 21, 22, 23, 24], external_tokens)
    return v, turn1


def test_a_loaded_hit_is_four_calls_and_finishes_without_one(
        engine: tuple[Engine, list[str]]) -> None:
    e, calls = engine
    _, turn1 = _admitted(e, calls)
    assert e.sched.hit_sources("b") == (0, 12)  # all on SSD: as its lookup found it
    assert calls == ["num_matched_tokens"]  # the admission waits for the step
    plan, _, recving, invalid = e.step()
    assert [t.request_id for t in plan.loads] == ["b"] and recving == {"b"} and not invalid
    assert calls == ["num_matched_tokens", "step", "update"]
    for layer in range(3):
        for j, slot in enumerate([5, 6, 7]):
            assert e.block(layer, 20 + j) == e.block(layer, slot)
    ran = view("b", turn1, out=3, computed=len(turn1), session="s")
    plan = e.sched.build_step((), [(ran, [20, 21, 22, 23, 24])])  # the rest computed
    assert calls == ["num_matched_tokens", "step", "update", "step"]
    delay, params = e.sched.request_finished(ran)
    assert calls == ["num_matched_tokens", "step", "update", "step"]  # its own answer
    assert delay == bool(plan.stores) and params is not None
    mine = params["flatcake"]
    assert (mine["hit_tokens"], mine["loaded_tokens_ssd"], mine["loaded_tokens_memory"],
            mine["load_error_blocks"], mine["turn_index"]) == (12, 12, 0, 0, 1)
    assert ("stored_blocks" in mine) == bool(plan.stores)
    stats = e.sched.take_stats()  # the books learned the finish with this call, first
    assert stats["hit_tokens"] == 12 and stats["loaded_tokens_ssd"] == 12


def test_an_admission_goes_with_the_next_lookup(engine: tuple[Engine, list[str]]) -> None:
    e, calls = engine
    _admitted(e, calls)
    assert e.sched.num_matched_tokens(view("c", tokens([], 9, 700)), 0) == (0, False)
    assert calls == ["num_matched_tokens"] * 2  # b's admission went with c's lookup
    plan = e.sched.build_step()
    assert [t.request_id for t in plan.loads] == ["b"] and not plan.failed_loads
    assert calls == ["num_matched_tokens"] * 2 + ["step"]


def test_an_admission_refused_is_a_load_error_of_the_step_carrying_it(
        engine: tuple[Engine, list[str]]) -> None:
    e, calls = engine
    v, _ = _admitted(e, calls, 8)  # not the hit the books found
    plan = e.sched.build_step()
    assert calls == ["num_matched_tokens", "step"]
    assert not plan.loads and plan.failed_loads == (FailedLoad("b", (20, 21), True),)
    assert e.sched.build_step().failed_loads == ()  # once
    delay, params = e.sched.request_finished(v)  # nothing loaded: answered here
    assert calls == ["num_matched_tokens", "step"]
    assert not delay and params is not None and params["flatcake"]["hit_tokens"] == 0
    assert e.sched.take_stats().get("hit_tokens", 0) == 0


def test_a_step_while_a_store_is_written_sends_nothing(
        engine: tuple[Engine, list[str]]) -> None:
    e, calls = engine
    v = view("r1", tokens([], 13, 100), computed=13)
    e.sched.num_matched_tokens(v, 0)
    plan = e.sched.build_step((), [(v, [0, 1, 2])])
    store = plan.stores[0].plan
    for _ in range(3):  # the engine keeps stepping while the workers write it
        assert e.sched.has_pending_stores()
        assert e.sched.build_step() == type(plan)()
    assert calls == ["num_matched_tokens", "step"]
    e.sched.on_report(WorkerReport(stores=(StoreDone("r1", store.segment.segment_id, True),)))
    assert e.sched.take_released([]) == []
    assert calls == ["num_matched_tokens", "step", "update"]
    assert not e.sched.has_pending_stores()
    other = view("r2", tokens([], 13, 100))  # the same prompt: published
    assert e.sched.num_matched_tokens(other, 0)[0] == 12


def test_stats_are_asked_at_most_every_interval_and_none_lost(
        engine: tuple[Engine, list[str]]) -> None:
    e, calls = engine
    sched = e.sched
    assert isinstance(sched, RemoteSchedulerSide)
    sched.stats_every_s = 3600.0  # vLLM asks after every step
    first, second = view("r1", tokens([], 13, 100)), view("r2", tokens([], 9, 300))
    sched.new_request(first)
    sched.num_matched_tokens(first, 0)
    assert sched.take_stats()["prompt_tokens"] == 13
    sched.new_request(second)
    sched.num_matched_tokens(second, 0)
    for _ in range(5):
        assert sched.take_stats() == {}
    assert calls == ["num_matched_tokens", "take_stats", "num_matched_tokens"]
    sched.stats_every_s = 0.0
    sched._stats_due = 0.0  # the interval is up
    assert sched.take_stats()["prompt_tokens"] == 9  # counted while not asked


def test_a_step_with_work_in_flight_still_renews_the_lease(
        engine: tuple[Engine, list[str]]) -> None:
    e, calls = engine
    sched = e.sched
    assert isinstance(sched, RemoteSchedulerSide)
    v = view("r1", tokens([], 13, 100), computed=13)
    sched.num_matched_tokens(v, 0)
    sched.build_step((), [(v, [0, 1, 2])])  # its store is written from now on
    sched.build_step()
    assert calls == ["num_matched_tokens", "step"]
    sched._last_call -= sched._keepalive_s + 1  # a quarter of the lease without a call
    sched.build_step()
    assert calls == ["num_matched_tokens", "step", "step"]


def test_an_admission_refused_with_a_lookup_is_a_load_error_of_the_next_step(
        engine: tuple[Engine, list[str]]) -> None:
    e, calls = engine
    _admitted(e, calls, 8)  # not the hit the books found
    assert e.sched.num_matched_tokens(view("c", tokens([], 9, 700)), 0) == (0, False)
    assert calls == ["num_matched_tokens"] * 2
    plan = e.sched.build_step()  # nothing else to hand out: no call
    assert calls == ["num_matched_tokens"] * 2
    assert not plan.loads and plan.failed_loads == (FailedLoad("b", (20, 21), True),)


def _held(e: Engine, calls: list[str]) -> list[int]:
    """Session ``s``'s first turn (3 full blocks + 1 token, slots 5-8) durable on SSD;
    its prompt, the calls counted from here."""
    turn0 = list(range(100, 113))
    finish(e, "a", turn0, [5, 6, 7, 8], out=3, session="s")
    e.step()
    calls.clear()
    return turn0


def test_a_request_held_in_the_engines_cache_is_one_call(
        engine: tuple[Engine, list[str]]) -> None:
    e, calls = engine
    v = view("b", _held(e, calls), computed=13, session="s")  # vLLM holds its 3 blocks
    e.sched.new_request(v)
    assert e.sched.num_matched_tokens(v, 12) == (0, False)
    plan = e.sched.build_step((), [(v, [5, 6, 7, 8])])  # the step computing its last token
    assert not plan.stores and e.sched.prompt_computed(v, [5, 6, 7, 8]) is None
    delay, params = e.sched.request_finished(v)
    assert not delay and params is not None and "stored_blocks" not in params["flatcake"]
    assert calls == ["num_matched_tokens"]


def _whole_hit(e: Engine, calls: list[str]) -> list[int]:
    """``_held``, then its prompt again as ``b``: looked up (an SSD hit of all its 3
    full blocks) and admitted into slots 20-23."""
    turn0 = _held(e, calls)
    v = view("b", turn0, session="s")
    e.sched.new_request(v)
    assert e.sched.num_matched_tokens(v, 0) == (12, True)
    e.sched.after_alloc("b", [20, 21, 22, 23], 12)
    return turn0


def test_a_loaded_whole_hit_is_three_calls(engine: tuple[Engine, list[str]]) -> None:
    e, calls = engine
    turn0 = _whole_hit(e, calls)
    _, _, recving, invalid = e.step()
    assert recving == {"b"} and not invalid
    ran = view("b", turn0, out=3, computed=13, session="s")
    assert not e.sched.build_step((), [(ran, [20, 21, 22, 23])]).stores
    delay, params = e.sched.request_finished(ran)
    assert calls == ["num_matched_tokens", "step", "update"]
    assert not delay and params is not None
    assert (params["flatcake"]["hit_tokens"], params["flatcake"]["loaded_tokens_ssd"]) == (12, 12)


def test_a_whole_hit_loaded_short_is_computed_with_a_call(
        engine: tuple[Engine, list[str]]) -> None:
    e, calls = engine
    turn0 = _whole_hit(e, calls)
    assert [t.request_id for t in e.sched.build_step().loads] == ["b"]
    # Its workers delivered one block of three (the others failed): the engine computes
    # them, and the step computing them asks the books whether to store them.
    e.sched.on_report(WorkerReport(loads=(LoadDone("b", 1, 3),)))
    assert e.sched.take_released(["b"]) == ["b"]
    ran = view("b", turn0, out=3, computed=13, session="s")
    e.sched.build_step((), [(ran, [20, 21, 22, 23])])
    assert calls == ["num_matched_tokens", "step", "update", "step"]
