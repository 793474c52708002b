"""The round trips an attached engine's scheduler half makes: a request's ``new_request``
goes with its lookup (one call for the two hooks), and when another call comes first it
goes alone just before it, so the service sees every request enter before anything
else the engine asks (its prompt tokens counted, its blocks in the shared-prefix
refcount)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flatcake.connectors.node_client import RemoteSchedulerSide
from tests.connectors.sides_harness import tokens, view
from tests.service.helpers import Engine, Service

pytest.importorskip("zmq")


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
    assert calls == ["new_request", "request_finished"]
    assert not delay and params is None  # the books never looked it up
    assert e.sched.take_stats()["prompt_tokens"] == 13
