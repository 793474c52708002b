"""Both scheduler halves keep the one contract the engine connectors call
(``connectors.base.SchedulerHalf``): every call it names, with the same parameters, in
the embedded half and in the node service's twin; and the embedded half refuses by name
what its request driver does not allow (a report of no load, a load never looked up)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from flatcake.connectors.base import SchedulerHalf
from flatcake.connectors.node_client import RemoteSchedulerSide
from flatcake.connectors.scheduler_side import SchedulerSide
from flatcake.plan.driver import IllegalTransition
from flatcake.plan.tasks import LoadDone, WorkerReport
from tests.connectors.sides_harness import Harness, ssd_hit_admitted

MEMBERS = sorted(name for name in vars(SchedulerHalf)
                 if not name.startswith("_") and name not in {"recovered_segments",
                                                               "ssd_in_step"})


def test_the_contract_names_every_call_the_vllm_connector_makes() -> None:
    assert {"num_matched_tokens", "after_alloc", "build_step", "on_report",
            "take_released", "request_finished", "take_stats", "close"} <= set(MEMBERS)


@pytest.mark.parametrize("half", [SchedulerSide, RemoteSchedulerSide])
@pytest.mark.parametrize("name", MEMBERS)
def test_each_half_answers_each_call_with_the_contracts_parameters(half: type,
                                                                   name: str) -> None:
    want = inspect.signature(getattr(SchedulerHalf, name))
    got = inspect.signature(getattr(half, name))
    assert list(got.parameters) == list(want.parameters), (half.__name__, name)


def test_an_attached_engine_loads_every_ssd_hit_async() -> None:
    assert RemoteSchedulerSide.ssd_in_step is False


def test_a_report_of_no_load_or_a_load_never_looked_up_is_refused_by_name(
        tmp_path: Path) -> None:
    h = Harness(tmp_path)
    ssd_hit_admitted(h)
    with pytest.raises(IllegalTransition, match="'ghost' cannot report while finished"):
        h.sched.on_report(WorkerReport(loads=(LoadDone("ghost", 1, 1),)))
    with pytest.raises(ValueError, match=r"'never': .* never looked up"):
        h.sched.after_alloc("never", [1, 2, 3], 8)
    # The load planned stands: its restore runs and lands as planned.
    plan, _, recving, invalid = h.step()
    assert [t.request_id for t in plan.loads] == ["b"] and recving == {"b"}
    assert plan.loads[0].block_ids[:3] == (20, 21, 22) and invalid == set()
    h.close()
