"""The replay's FlatCake system on the request driver (``plan.driver``): every request
goes through the driver's phases, in the table's order, whichever way it loads (nothing
to load, an SSD restore waiting for an FC-MAS slot, an SSD hit loaded with its prefill);
a step the table does not allow raises; nothing is held once the run ends."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Hashable
from typing import Any

import pytest

from flatcake.plan.driver import Event, IllegalTransition, Phase, RequestTable, Tracked
from flatcake.replay.simulate import replay_node
from flatcake.replay.systems.flatcake import FlatCakeSystem
from flatcake.replay.workload.trace import from_requests
from tests.replay.helpers import GEOMETRY, ids, tiny_preset

BT = GEOMETRY.tokens_per_block
P = Phase
EVERY_PHASE = [P.ADMITTED, P.QUEUED, P.STARTED, P.REPORTED, P.RELEASED, P.FINISHED]

# Three new prompts fill the store; A and B come back at once, each extended by two
# blocks. A 14-block GPU pool and a 10-block host tier: A and B come from SSD.
REQUESTS = [(0.0, ids(0, 10)), (1.0, ids(100, 110)), (2.0, ids(200, 210)),
            (10.0, ids(0, 12)), (10.0, ids(100, 112))]


@pytest.fixture
def phases(monkeypatch: pytest.MonkeyPatch) -> dict[Hashable, list[Phase]]:
    """Every phase each request of the run enters, in order."""
    seen: dict[Hashable, list[Phase]] = defaultdict(list)
    move = RequestTable.move

    def recording(self: RequestTable[Any, Any], req: Tracked[Any, Any],
                  event: Event) -> None:
        move(self, req, event)
        seen[req.request_id].append(req.phase)

    monkeypatch.setattr(RequestTable, "move", recording)
    return seen


def _run(system: str, in_step: bool = False) -> FlatCakeSystem:
    preset = tiny_preset(gpu_blocks=14, host_blocks=10, slots=1, ssd_read_bytes_per_s=1e7)
    preset = dataclasses.replace(preset, node=dataclasses.replace(
        preset.node, ssd_loads_in_step=in_step))
    wl = from_requests([(t, b, len(b) * BT, 2) for t, b in REQUESTS], BT)
    _, node = replay_node(wl, system, 0.5, preset)
    assert node.rec.hit_blocks[3:].tolist() == [10, 10]  # both restored from SSD
    fc = node.system
    assert isinstance(fc, FlatCakeSystem)
    return fc


@pytest.mark.parametrize(("system", "in_step"), [("flatcake", False),
                                                 ("flatcake-1q", False),
                                                 ("flatcake", True)])
def test_every_request_goes_through_every_phase_once(
        phases: dict[Hashable, list[Phase]], system: str, in_step: bool) -> None:
    fc = _run(system, in_step)
    # Named by their trace index; new prompts (nothing to load) and restores alike.
    assert dict(phases) == {i: EVERY_PHASE for i in range(len(REQUESTS))}
    assert [len(d) for d in fc.drivers] == [0]
    fcmas = fc.drivers[0].fcmas
    assert len(fcmas) == 0 and fcmas.stats.num_submitted == len(REQUESTS)
    # The restores took an FC-MAS slot, unless they loaded with their prefill.
    assert fcmas.stats.num_restores_done == (0 if in_step else 2)


def test_a_restore_reported_twice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    refused: list[tuple[int, Phase]] = []
    restore_done = FlatCakeSystem.restore_done

    def twice(self: FlatCakeSystem, arg: Any) -> None:
        restore_done(self, arg)
        tracked = self.tracked(arg[0])
        with pytest.raises(IllegalTransition, match="cannot report while"):
            self.drivers[0].reported(tracked)
        refused.append((tracked.request_id, tracked.phase))

    monkeypatch.setattr(FlatCakeSystem, "restore_done", twice)
    _run("flatcake")
    # Out of the ready queue already (the worker was idle), or waiting in it.
    assert [i for i, _ in refused] == [3, 4]
    assert {phase for _, phase in refused} <= {P.REPORTED, P.RELEASED}
