"""The round trips an attached engine's scheduler half makes: a request's ``new_request``
goes with its lookup (one call for the two hooks), and when another call comes first it
goes alone just before it, so the service sees every request enter before anything
else the engine asks (its prompt tokens counted, its blocks in the shared-prefix
refcount); the store a step plans goes with the step; a request without a load
finishes without a call, the service learning of it with the next one, before what
that one asks. A new request is three calls: lookup, step, the workers' report."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flatcake.connectors.node_client import RemoteSchedulerSide
from flatcake.plan.tasks import StoreDone, WorkerReport
from tests.connectors.sides_harness import tokens, view
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
