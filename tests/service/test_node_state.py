"""An engine of several KV cache groups (an attention layer and a recurrent state layer
whose pages are padded: ``tests/connectors/test_state_checkpoints``) attached to a real
node service, without vLLM: its loads are async, an all-memory hit too (vLLM learns a
failed load of such an engine only by request); the state stored from the block vLLM
named for the segment's end is restored into the hit's last state block only; a state
row rotted on disk is never served (its crc fails: the request is recomputed, the
block untouched); an engine of another geometry is refused naming both."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from flatcake.connectors.group_slots import StepSlots
from flatcake.connectors.node_client import RemoteSchedulerSide
from flatcake.connectors.state_checkpoints import StateCheckpoints, with_states
from flatcake.connectors.worker_side import WorkerSide
from flatcake.geometry import LayerGroup
from flatcake.link.client import worker_root
from flatcake.link.wire import NodeRefused, TensorRanks
from flatcake.plan.tasks import StepPlan
from tests.connectors.sides_harness import grouped_step, view
from tests.connectors.state_helpers import PAGES, SLOTS, STATE, TURN0, G
from tests.service.helpers import Service, node_settings
from tests.store.helpers import rot_last_segment

TURN1 = [*TURN0, *range(200, 208)]
LOAD = StepSlots(loads={"b": ((20, 21, 22, 23, 24), (0, 0, 50, 51, 52))})


class Attached:
    """The two halves of an engine of geometry ``G`` attached to the service at
    ``sock``, over a random paged KV (seed ``seed``)."""

    def __init__(self, sock: Path, seed: int) -> None:
        where = worker_root(str(sock), 1.0, 0, G, TensorRanks(), wait_s=10)
        self.worker = WorkerSide(G, where.config, where.store_dir,
                                 arena_path=where.arena_path)
        self.sched = RemoteSchedulerSide(G, node_settings(sock), async_loads=True)
        gen = torch.Generator().manual_seed(seed)
        self.kv = [torch.randint(0, 256, (SLOTS, 512), generator=gen, dtype=torch.uint8)
                   for _ in range(2)]
        self.worker.register(self.kv, (0, 1), pages=PAGES)

    def store_turn0(self) -> None:
        """Turn 0 of session ``s`` (3 blocks), its end state vLLM's block 40."""
        v0 = view("a", TURN0, computed=13, session="s")
        assert self.sched.num_matched_tokens(v0, 0) == (0, False)
        book = StateCheckpoints((1,), 4)
        book.offered({"a": [(1, 39, 8), (1, 40, 12)]})
        slots = with_states(((5, 6, 7), (0, 0, 0)), (0, 1), {1: book.slots("a", 0, 3)[0]})
        plan = self.sched.build_step(computed=[(v0, [5, 6, 7])])
        assert [t.plan.segment.num_blocks for t in plan.stores] == [3]
        self.worker.start_step(plan, StepSlots(stores={"a": slots}))
        self.worker.end_step()
        self.sched.request_finished(v0)
        grouped_step(self.worker, self.sched, StepSlots())  # type: ignore[arg-type]

    def load_turn1(self) -> tuple[set[str], set[str]]:
        """Turn 1's lookup (the 12 tokens of turn 0) and its load: (restored, failed)."""
        v1 = view("b", TURN1, session="s")
        assert self.sched.num_matched_tokens(v1, 0) == (12, True)
        self.sched.after_alloc("b", [20, 21, 22, 23, 24], 12)
        return grouped_step(self.worker, self.sched, LOAD)  # type: ignore[arg-type]

    def close(self) -> None:
        self.worker.close()
        self.sched.close()


def test_a_state_group_is_served_through_the_node_service(tmp_path: Path) -> None:
    # Spare memory: turn 0's SSD segment also gets a memory copy, so its hit is
    # all-memory, and still async.
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "placement.memory_copy_watermark=0.9").start()
    try:
        first = Attached(svc.sock, seed=11)
        attn, state = first.kv[0][[5, 6, 7]].clone(), first.kv[1][40][:STATE].clone()
        first.store_turn0()
        first.close()
        fresh = Attached(svc.sock, seed=12)
        before = fresh.kv[1].clone()
        assert fresh.load_turn1() == ({"b"}, set())
        assert torch.equal(fresh.kv[0][[20, 21, 22]], attn)
        assert torch.equal(fresh.kv[1][50][:STATE], state)
        changed = (fresh.kv[1] != before).any(dim=1).nonzero().flatten().tolist()
        assert changed == [50]  # the padding, the null block and later blocks untouched
        totals = fresh.sched.take_stats()
        assert totals["loaded_tokens_memory"] == 12 and "load_error_blocks" not in totals
        fresh.close()
        # Another geometry (its state of another size) is refused, naming both.
        other = dataclasses.replace(G, groups=(G.groups[0], LayerGroup.state(
            1, [[2, 26]], ["float32"], 4)))
        with pytest.raises(NodeRefused, match=r"serves geometry 'tiny-state' \(1 full \+ 1 "
                                              r"state layers; 1 x 512 B \+ 1 x 200 B"):
            worker_root(str(svc.sock), 1.0, 0, other, TensorRanks(), wait_s=10)
    finally:
        assert svc.stop() == 0, svc.stderr()


def test_a_rotted_state_row_is_never_served_through_the_node_service(tmp_path: Path
                                                                     ) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock").start()
    try:
        first = Attached(svc.sock, seed=11)
        first.store_turn0()  # on SSD, no copy
        first.close()
        rot_last_segment(svc.root, 1, 5)  # the state layer's row, its 6th byte
        fresh = Attached(svc.sock, seed=12)
        before = [t.clone() for t in fresh.kv]
        restored, failed = fresh.load_turn1()
        assert restored == {"b"}  # reported done (vLLM learns the failure by request)
        assert failed == {"b"}  # its crc failed: the engine recomputes the request
        assert torch.equal(fresh.kv[1], before[1])  # no state byte written
        plan: StepPlan = fresh.sched.build_step()
        assert not plan.loads
        # The books stopped serving it: the next lookup misses.
        assert fresh.sched.num_matched_tokens(view("c", TURN1, session="s"), 0) == (0, False)
        fresh.close()
    finally:
        assert svc.stop() == 0, svc.stderr()
