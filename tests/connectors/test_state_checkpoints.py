"""The state checkpoints vLLM offers a connector (``boundary_state_offloads``) as the
slots of a segment's state rows (``connectors.state_checkpoints``), and the connector's
two halves storing and restoring a model with a recurrent state layer beside an
attention layer, without vLLM: the state is stored from the block vLLM named for the
segment's end (its padding left out), a segment without it is not stored, and a restore
writes the state into the hit's last block of the state group only."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flatcake.connectors.group_slots import StepSlots
from flatcake.connectors.scheduler_side import SchedulerSide
from flatcake.connectors.state_checkpoints import StateCheckpoints, with_states
from flatcake.connectors.worker_side import WorkerSide
from tests.connectors.sides_harness import grouped_step, settings, view
from tests.connectors.state_helpers import PAGES, SLOTS, STATE, TURN0, G


def test_offers_become_the_slots_at_each_blocks_end() -> None:
    book = StateCheckpoints((1, 2), 4)
    book.offered({"a": [(1, 40, 12), (2, 41, 12), (1, 39, 8), (1, 33, 6)]})
    book.offered({"a": [(1, 44, 12)], "b": [(2, 9, 4)]})  # a later offer replaces
    assert book.slots("a", 0, 3) == ((0, 39, 44), (0, 0, 41))
    assert book.slots("a", 2, 3) == ((44,), (41,))
    assert book.boundaries("a") == (12,)
    assert book.slots("c", 0, 2) == ((0, 0), (0, 0))
    assert with_states(((5, 6, 7), (0, 0, 0), (1, 2, 3)), (3, 1, 2),
                       {1: (0, 39, 44), 2: (0, 0, 41)}) == \
        ((5, 6, 7), (0, 39, 44), (0, 0, 41))
    book.forget(["a"])
    assert book.slots("a", 0, 3) == ((0, 0, 0), (0, 0, 0))
    with pytest.raises(ValueError, match="group 5 offered"):
        book.offered({"a": [(5, 3, 4)]})
    with pytest.raises(ValueError, match="block 0 at token 4"):
        book.offered({"a": [(1, 0, 4)]})


class Engine:
    """Scheduler half, worker half and a random paged KV of one attention layer (group
    0) and one state layer (group 1) whose pages are padded."""

    def __init__(self, root: Path, *overrides: str) -> None:
        s = settings(*overrides)
        self.worker = WorkerSide(G, s, root)
        self.sched = SchedulerSide(G, s, root, async_loads=True)
        gen = torch.Generator().manual_seed(11)
        self.kv = [torch.randint(0, 256, (SLOTS, 512), generator=gen, dtype=torch.uint8)
                   for _ in range(2)]
        self.worker.register(self.kv, (0, 1), pages=PAGES)
        self.book = StateCheckpoints((1,), 4)

    def store_turn0(self, offers: list[tuple[int, int, int]]) -> None:
        v0 = view("a", TURN0, computed=13, session="s")
        self.sched.num_matched_tokens(v0, 0)
        plan = self.sched.prompt_computed(v0, [5, 6, 7])
        assert plan is not None and plan.segment.num_blocks == 3
        self.book.offered({"a": offers})
        slots = with_states(((5, 6, 7), (0, 0, 0)), (0, 1), {1: self.book.slots("a", 0, 3)[0]})
        self.sched.request_finished(v0)
        grouped_step(self.worker, self.sched, StepSlots(stores={"a": slots}))

    def close(self) -> None:
        self.worker.close()
        self.sched.close()


def test_the_state_offered_at_a_segments_end_is_restored_into_the_hits_last_block(
        tmp_path: Path) -> None:
    e = Engine(tmp_path)
    attn = e.kv[0][[5, 6, 7]].clone()
    state = e.kv[1][40][:STATE].clone()
    e.store_turn0([(1, 39, 8), (1, 40, 12)])
    assert e.sched.totals()["stores_ok"] == 1
    e.kv[1][40].zero_()  # the engine reuses the checkpoint's block once stored
    v1 = view("b", [*TURN0, *range(200, 208)], session="s")
    assert e.sched.num_matched_tokens(v1, 0) == (12, True)
    e.sched.after_alloc("b", [20, 21, 22, 23, 24], 12)
    before = e.kv[1].clone()
    # vLLM's state list after an external hit: null but the hit's last block.
    recving, failed = grouped_step(e.worker, e.sched, StepSlots(
        loads={"b": ((20, 21, 22, 23, 24), (0, 0, 50, 51, 52))}))
    assert recving == {"b"} and failed == set()
    assert torch.equal(e.kv[0][[20, 21, 22]], attn)
    assert torch.equal(e.kv[1][50][:STATE], state)
    changed = (e.kv[1] != before).any(dim=1).nonzero().flatten().tolist()
    assert changed == [50]  # the padding, the null block and later blocks untouched
    assert torch.equal(e.kv[1][50][STATE:], before[50][STATE:])
    e.close()


def test_an_all_memory_hit_loads_async_in_the_step_it_is_admitted(tmp_path: Path) -> None:
    # Spare memory: turn 0's SSD segment gets a memory copy, the hit reads only it. No
    # FC-MAS slot to wait for: its load is in the next step's plan, async (vLLM learns a
    # failed load of several groups only by request).
    e = Engine(tmp_path, "placement.memory_copy_watermark=0.9")
    e.store_turn0([(1, 40, 12)])
    state = e.kv[1][40][:STATE].clone()
    v1 = view("b", [*TURN0, *range(200, 208)], session="s")
    assert e.sched.num_matched_tokens(v1, 0) == (12, True)
    e.sched.after_alloc("b", [20, 21, 22, 23, 24], 12)
    assert e.sched.hit_sources("b") == (12, 0)
    recving, failed = grouped_step(e.worker, e.sched, StepSlots(
        loads={"b": ((20, 21, 22, 23, 24), (0, 0, 50, 51, 52))}))
    assert recving == {"b"} and failed == set()
    assert torch.equal(e.kv[1][50][:STATE], state)
    totals = e.sched.totals()
    assert totals["loaded_tokens_memory"] == 12 and totals.get("restores_started", 0) == 0
    e.close()


def test_a_segment_whose_end_state_was_not_offered_is_not_stored(tmp_path: Path) -> None:
    e = Engine(tmp_path)
    e.store_turn0([(1, 39, 8)])  # the state at token 12 never offered
    totals = e.sched.totals()
    assert totals["stores_failed"] == 1 and totals.get("stores_ok", 0) == 0
    v1 = view("b", [*TURN0, *range(200, 208)], session="s")
    assert e.sched.num_matched_tokens(v1, 0) == (0, False)
    e.close()


def test_a_checkpoint_whose_block_the_request_no_longer_holds_is_not_a_slot() -> None:
    book = StateCheckpoints((1,), 4)
    book.offered({"a": [(1, 39, 8), (1, 40, 12)]})
    # vLLM nulled and freed block 39 (the state at token 8) since offering it.
    assert book.slots("a", 0, 3, {1: {0, 40, 41}}) == ((0, 0, 40),)
    assert book.slots("a", 0, 3, {1: set()}) == ((0, 0, 0),)
