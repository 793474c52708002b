"""A worker closing while SSD loads are in flight: the wait for them is bounded, and a
load that did not finish is never reported (so nothing of it is served). Closed with
nothing in flight, it leaves no thread of its own running."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from flatcake.cio.staging import StagingWindow
from flatcake.connectors.worker_side import WorkerSide
from flatcake.plan.tasks import StepPlan
from tests.connectors.sides_harness import G4K, G, Harness, finish, settings, tokens, view


def test_close_waits_for_loads_in_flight_within_its_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # The books start two restores in one step; the worker has one staging window, so
    # the second waits behind the first, which hangs in its reads.
    h = Harness(tmp_path, settings("scheduler.max_restores_in_flight=2"))
    turns = {}
    for i, rid in enumerate(("a", "b")):
        turns[rid] = list(range(100 + 100 * i, 113 + 100 * i))
        finish(h, rid, turns[rid], [5 + 4 * i, 6 + 4 * i, 7 + 4 * i, 8 + 4 * i], out=3,
               session=rid)
    h.step()
    h.worker.close()
    worker = WorkerSide(G, settings("scheduler.max_restores_in_flight=1"), tmp_path,
                        drain_timeout_s=0.3)
    worker.register(h.kv)
    h.worker = worker
    entered, gate = threading.Event(), threading.Event()
    real_run = StagingWindow.run

    def hung_run(self: StagingWindow, *args: object) -> object:
        entered.set()
        gate.wait(30)
        return real_run(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(StagingWindow, "run", hung_run)
    for i, rid in enumerate(("a", "b")):
        v = view(f"{rid}1", tokens(turns[rid], 8, 900), session=rid)
        assert h.sched.num_matched_tokens(v, 0) == (12, True)
        h.sched.after_alloc(v.request_id, list(range(30 + 6 * i, 36 + 6 * i)), 12)
    plan = h.sched.build_step()
    assert [t.sync for t in plan.loads] == [False, False]
    worker.start_step(plan)
    assert entered.wait(10)
    closer = threading.Thread(target=worker.close)
    with caplog.at_level(logging.WARNING, "flatcake.cio.executor"):
        closer.start()
        closer.join(10)
    try:
        assert not closer.is_alive()  # without a bound it waits for the hung read
        assert "closed with 2 loads still in flight" in caplog.text
        _, recving, invalid, report = worker.poll()
        assert recving == set() and invalid == set() and report.loads == ()
    finally:
        gate.set()
        closer.join(10)
    _, recving, _, report = worker.poll()
    assert "b1" not in recving  # never started: cancelled, never reported
    # The late load is over: closing again frees what it kept (windows, readers, files).
    assert worker.executor.close(timeout_s=10) is True
    h.sched.close()


def test_close_with_nothing_in_flight_closes_everything(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.worker.start_step(StepPlan())
    assert h.worker.executor.close(timeout_s=0.0) is True
    h.close()


def test_close_stops_every_thread_the_worker_started(tmp_path: Path) -> None:
    # 4 KiB blocks: the turn is written straight from the slots, on the writer's threads.
    before = set(threading.enumerate())
    h = Harness(tmp_path, g=G4K)
    finish(h, "a", list(range(100, 113)), [5, 6, 7, 8], out=3, session="s")
    plan, sending, _, _ = h.step()
    assert len(plan.stores) == 1 and sending == {"a"}
    started = [t for t in threading.enumerate()
               if t not in before and t.name.startswith("flatcake-")]
    assert any(t.name.startswith("flatcake-write_") for t in started), started
    h.close()
    for t in started:
        t.join(5)
    assert [t.name for t in started if t.is_alive()] == []
