"""The request driver (``plan.driver``), scripted on the books alone: an SSD restore
through every phase with two workers reporting, loads in the step in FC-MAS's order, a
request finished while its load runs, the ready queue's release order, late reads,
abandon, and every step the table does not allow refused by name."""

from __future__ import annotations

import pytest

from flatcake.control.plane import ControlPlane
from flatcake.control.scheduler import RestoreRequest
from flatcake.plan.driver import (
    TRANSITIONS,
    Event,
    IllegalTransition,
    Phase,
    RequestDriver,
    Tracked,
)
from flatcake.plan.requests import load
from flatcake.plan.tasks import LoadDone
from tests.control.helpers import chat_turn, first_turn, make, skeys


def _plan(cp: ControlPlane, driver: RequestDriver[str], rid: str, session: str, n: int,
          *, in_step: bool = False) -> Tracked[str]:
    """Admit ``rid`` and plan the load of ``session``'s first ``n`` blocks."""
    req = driver.admit(rid, f"books of {rid}")
    task, plan = load(cp, rid, cp.lookup(skeys(session, n)), list(range(n)))
    driver.plan(req, task, plan, in_step=in_step)
    return req


def test_an_ssd_restore_goes_through_every_phase_once_every_worker_reported() -> None:
    cp, _ = make()
    first_turn(cp, "s", 3)
    driver: RequestDriver[str] = RequestDriver(cp, world_size=2)
    req = _plan(cp, driver, "r", "s", 3)
    assert req.phase is Phase.QUEUED and driver.num_waiting == 1 and driver.num_loading == 1
    (started,) = driver.start_restores()
    assert started is req and req.phase is Phase.STARTED and req.slot
    assert driver.num_waiting == 0 and cp.restores_in_flight == 1
    assert driver.gather(LoadDone("r", 3, 3)) is None  # one worker of two
    assert driver.gather(LoadDone("r", 3, 3)) is req
    driver.reported(req)
    # The slot is given back; the request waits in the ready queue until it leaves it.
    assert req.phase is Phase.REPORTED and cp.restores_in_flight == 0
    assert driver.take_released(["r"]) == []
    driver.release_ready()
    assert req.phase is Phase.RELEASED and driver.take_released(["r"]) == ["r"]
    assert driver.get("r") is req and req.books == "books of r"
    assert driver.finish("r") is req and len(driver) == 0 and driver.get("r") is None
    cp.complete_load("r")


def test_loads_in_the_step_start_in_fc_mas_order_and_release_at_their_report() -> None:
    cp, clock = make()
    first_turn(cp, "ssd", 4)  # on SSD (the first-turn rule)
    first_turn(cp, "mem", 1)
    chat_turn(cp, "mem", 3)  # its last two blocks in memory
    driver: RequestDriver[str] = RequestDriver(cp)
    _plan(cp, driver, "a", "ssd", 4, in_step=True)
    _plan(cp, driver, "b", "mem", 3, in_step=True)
    assert driver.num_waiting == 0 and driver.num_loading == 2
    clock.set(1.0)
    # The one reading less SSD first (1 + wait / kv bytes), whatever the order planned.
    assert [r.request_id for r in driver.take_step()] == ["b", "a"]
    assert driver.take_step() == []
    for rid in ("a", "b"):
        req = driver.gather(LoadDone(rid, 3, 3))
        assert req is not None
        driver.reported(req)
        assert req.phase is Phase.RELEASED and not req.slot
        cp.complete_load(rid)
    assert driver.num_loading == 0 and cp.restores_in_flight == 0


def test_a_request_finished_while_its_load_runs_is_forgotten_once_released() -> None:
    cp, _ = make()
    first_turn(cp, "s", 3)
    driver: RequestDriver[str] = RequestDriver(cp)
    req = _plan(cp, driver, "r", "s", 3)
    assert driver.finish("r") is req and req.finished and req.loading
    # The engine no longer sees it; the load runs on (never cancelled).
    assert driver.get("r") is None and "r" in driver and driver.finish("r") is None
    driver.start_restores()
    done = driver.gather(LoadDone("r", 3, 3))
    assert done is req
    driver.reported(req)
    driver.release_ready()
    assert "r" not in driver and req.phase is Phase.FINISHED
    assert driver.take_released([]) == ["r"]  # the engine drops what it finished
    cp.complete_load("r")


def test_the_ready_queue_releases_restores_in_arrival_order() -> None:
    cp, _ = make()
    first_turn(cp, "s", 3)
    first_turn(cp, "t", 3)
    driver: RequestDriver[str] = RequestDriver(cp)
    first, second = _plan(cp, driver, "r1", "s", 3), _plan(cp, driver, "r2", "t", 3)
    assert {r.request_id for r in driver.start_restores()} == {"r1", "r2"}
    for req in (second, first):  # the later arrival's reads end first
        done = driver.gather(LoadDone(req.request_id, 3, 3))
        assert done is req
        driver.reported(req)
    assert driver.take_released(["r2"]) == []  # both wait in the ready queue
    driver.release_ready()
    assert driver.take_released(["r2", "r1", "other"]) == ["r1", "r2", "other"]


def test_a_host_that_weighs_its_own_requests_submits_them_under_its_own_ids() -> None:
    cp, _ = make()
    first_turn(cp, "s", 3)
    driver: RequestDriver[str, int] = RequestDriver(cp, queue=0)  # the replay's worker 0
    plan = cp.prepare_load(7, cp.lookup(skeys("s", 3)))
    restore = driver.admit(7, "an SSD restore")
    driver.submit(restore, cp.restore_request(7, 5.0, plan), plan)
    new = driver.admit(8, "a new prompt")
    with pytest.raises(ValueError, match="request 8 submitted to FC-MAS as 9"):
        driver.submit(new, RestoreRequest(9, 6.0, 0, False))
    driver.submit(new, RestoreRequest(8, 6.0, 0, False))  # nothing to load: ready now
    assert driver.fcmas is cp.restore_queue(0) and cp.restores_in_flight == 0
    (started,) = driver.start_restores()
    assert started is restore and restore.slot and driver.fcmas.num_in_flight == 1
    driver.reported(restore)
    # One at a time, by arrival: the restore (arrived at 5 s) before the new prompt.
    assert driver.pop_next() is restore and restore.phase is Phase.RELEASED
    assert driver.pop_next() is new and new.phase is Phase.STARTED
    assert driver.pop_next() is None
    driver.reported(new)  # no slot: released at once
    assert new.phase is Phase.RELEASED
    assert driver.finish(7) is restore and driver.finish(8) is new and len(driver) == 0
    cp.complete_load(7)


def test_late_reads_outlive_the_request_until_every_worker_ended_them() -> None:
    cp, _ = make()
    driver: RequestDriver[str] = RequestDriver(cp)
    driver.count_late("r", -1)  # its end may come before its late report
    assert not driver.disk_late()
    driver.count_late("r", 2)
    assert driver.disk_late()
    driver.count_late("r", -1)
    assert not driver.disk_late()


def test_abandon_forgets_every_request_from_any_phase() -> None:
    cp, _ = make()
    first_turn(cp, "s", 3)
    driver: RequestDriver[str] = RequestDriver(cp)
    driver.admit("looked-up", "")
    _plan(cp, driver, "queued", "s", 3)
    _plan(cp, driver, "in-step", "s", 3, in_step=True)
    assert [r.request_id for r in driver.loading()] == ["queued", "in-step"]
    gone = driver.abandon()
    assert {r.request_id for r in gone} == {"looked-up", "queued", "in-step"}
    assert len(driver) == 0 and driver.num_loading == 0 and driver.take_step() == []
    assert all(r.phase is Phase.FINISHED for r in gone)


def test_a_step_the_table_does_not_allow_is_refused_by_name() -> None:
    cp, _ = make()
    first_turn(cp, "s", 3)
    driver: RequestDriver[str] = RequestDriver(cp)
    req = _plan(cp, driver, "r", "s", 3)
    with pytest.raises(IllegalTransition, match="'r' cannot report while queued"):
        driver.gather(LoadDone("r", 3, 3))
    task, plan = req.task, req.plan
    assert task is not None and plan is not None
    with pytest.raises(IllegalTransition, match="'r' cannot plan while queued"):
        driver.plan(req, task, plan, in_step=False)
    with pytest.raises(IllegalTransition, match="'r' cannot admit while queued"):
        driver.admit("r", "")
    with pytest.raises(IllegalTransition, match="'x' cannot report while finished"):
        driver.gather(LoadDone("x", 1, 1))
    assert req.phase is Phase.QUEUED and driver.num_loading == 1  # nothing moved


def test_the_table_moves_forward_only_and_abandon_reaches_every_phase() -> None:
    order = [Phase.ADMITTED, Phase.QUEUED, Phase.STARTED, Phase.REPORTED, Phase.RELEASED]
    forward = [Event.PLAN, Event.START, Event.REPORT, Event.RELEASE]
    for at, event in enumerate(forward):
        assert TRANSITIONS[order[at], event] is order[at + 1]
    assert TRANSITIONS[Phase.RELEASED, Event.PLAN] is Phase.QUEUED  # admitted anew
    for phase in order:
        assert TRANSITIONS[phase, Event.ABANDON] is Phase.FINISHED
        assert TRANSITIONS[phase, Event.FINISH] in (phase, Phase.FINISHED)
    # Nothing leaves FINISHED but a new admission.
    assert [e for (p, e) in TRANSITIONS if p is Phase.FINISHED] == [Event.ADMIT]
