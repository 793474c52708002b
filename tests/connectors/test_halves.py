"""Both scheduler halves keep the one contract the engine connectors call
(``connectors.base.SchedulerHalf``): every call it names, with the same parameters, in
the embedded half and in the node service's twin."""

from __future__ import annotations

import inspect

import pytest

from flatcake.connectors.base import SchedulerHalf
from flatcake.connectors.node_client import RemoteSchedulerSide
from flatcake.connectors.scheduler_side import SchedulerSide

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
