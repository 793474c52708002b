"""The connector's halves for a model of several KV cache groups (vLLM's hybrid KV cache
manager), without vLLM: each layer's blocks move to and from its own group's slots, a
store is a snapshot taken when its forward pass ends, the null block is never written
nor stored, and every load is async."""

from __future__ import annotations

from pathlib import Path

import torch

from flatcake.cio.paged import PagedKV
from flatcake.connectors.group_slots import GroupedKV, GroupIds, StepSlots
from flatcake.connectors.scheduler_side import SchedulerSide
from flatcake.connectors.worker_side import WorkerSide
from flatcake.geometry import KVGeometry, LayerGroup
from tests.connectors.sides_harness import grouped_step, settings, view

# Two full-attention layers and one sliding-window layer (one block), 4-token blocks.
G = KVGeometry(3, 4, dtype="uint8", name="tiny-hybrid",
               groups=(LayerGroup(2, 128), LayerGroup(1, 128, window_tokens=4,
                                                      kind="sliding")))
SLOTS = 64
LAYER_GROUP = (0, 0, 1)


class Engine:
    """One engine of two block tables: scheduler half, worker half, random paged KV."""

    def __init__(self, root: Path) -> None:
        s = settings()
        self.worker = WorkerSide(G, s, root)
        self.sched = SchedulerSide(G, s, root, async_loads=True)
        gen = torch.Generator().manual_seed(3)
        self.kv = [torch.randint(0, 256, (SLOTS, 512), generator=gen, dtype=torch.uint8)
                   for _ in range(3)]
        self.worker.register(self.kv, LAYER_GROUP)

    def step(self, slots: StepSlots, after: object = None) -> tuple[set[str], set[str]]:
        """One step; ``after`` runs when the forward pass ends (the engine reusing a
        slot). Returns (finished loads, failed requests)."""
        return grouped_step(self.worker, self.sched, slots, after)

    def block(self, layer: int, slot: int) -> bytes:
        return self.kv[layer][slot].numpy().tobytes()

    def close(self) -> None:
        self.worker.close()
        self.sched.close()


def test_each_group_restores_into_its_own_slots_from_a_snapshot(tmp_path: Path) -> None:
    e = Engine(tmp_path)
    turn0 = list(range(100, 113))  # 3 full blocks + 1 token
    v0 = view("a", turn0, computed=13, session="s")
    e.sched.num_matched_tokens(v0, 0)
    plan = e.sched.prompt_computed(v0, [5, 6, 7])
    assert plan is not None and plan.segment.num_blocks == 3
    stored: GroupIds = ((5, 6, 7), (30, 31, 32))
    want = {(layer, j): e.block(layer, stored[LAYER_GROUP[layer]][j])
            for layer in range(3) for j in range(3)}

    def reuse() -> None:  # the engine frees and overwrites a sliding-window block
        e.kv[2][32].zero_()

    e.sched.request_finished(v0)
    e.step(StepSlots(stores={"a": stored}), reuse)
    assert e.sched.totals()["stores_ok"] == 1
    # Turn 1 hits 3 blocks: an async load (every load is, with several groups); the
    # sliding group's first block is the null block, its second outside its window.
    v1 = view("b", [*turn0, *range(200, 208)], session="s")
    assert e.sched.num_matched_tokens(v1, 0) == (12, True)
    e.sched.after_alloc("b", [20, 21, 22, 23, 24], 12)
    null_before, outside_before = e.block(2, 0), e.block(2, 41)
    recving, failed = e.step(StepSlots(loads={"b": ((20, 21, 22, 23, 24), (0, 41, 42, 43,
                                                                           44))}))
    assert recving == {"b"} and failed == set()
    for (layer, j), raw in want.items():
        slot = (20, 21, 22)[j] if LAYER_GROUP[layer] == 0 else (0, 41, 42)[j]
        if slot == 0:
            assert e.block(layer, 0) == null_before  # the null block is never written
        elif slot == 41:
            assert e.block(layer, 41) == outside_before  # the store keeps no more
        else:
            assert e.block(layer, slot) == raw, (layer, j)
    e.close()


def test_a_store_a_group_no_longer_holds_is_not_made(tmp_path: Path) -> None:
    e = Engine(tmp_path)
    v0 = view("a", list(range(100, 113)), computed=13, session="s")
    e.sched.num_matched_tokens(v0, 0)
    assert e.sched.prompt_computed(v0, [5, 6, 7]) is not None
    e.sched.request_finished(v0)
    # The sliding group holds no block the store keeps of it (its window: the last).
    e.step(StepSlots(stores={"a": ((5, 6, 7), (30, 31, 0))}))
    totals = e.sched.totals()
    assert totals["stores_failed"] == 1 and totals.get("stores_ok", 0) == 0
    v1 = view("b", list(range(100, 113)), session="s")
    assert e.sched.num_matched_tokens(v1, 0) == (0, False)
    e.close()


def test_scatter_moves_each_group_and_window_into_its_slots() -> None:
    """``GroupedKV.scatter`` alone: two full layers of one group share their blocks'
    slots; a group with a null block in the middle takes the blocks around it; a
    sliding layer (1-block window) only its last; a load starting past block 0."""
    gen = torch.Generator().manual_seed(5)
    kv = [torch.randint(0, 256, (SLOTS, 512), generator=gen, dtype=torch.uint8)
          for _ in range(4)]
    before = [t.clone() for t in kv]
    grouped = GroupedKV(PagedKV(kv, 512), (0, 0, 1, 2), null_id=0,
                        window_blocks=(0, 0, 0, 1))
    scratch = grouped.scratch(4)
    for buf in scratch.layer_bytes():
        buf.copy_(torch.randint(0, 256, buf.shape, generator=gen, dtype=torch.uint8))
    rows = [buf.view(4, 512) for buf in scratch.layer_bytes()]
    ids: GroupIds = ((10, 11, 12, 13), (20, 21, 0, 23), (30, 31, 32, 33))
    grouped.scatter(scratch, ids, 1, 4)
    want = {0: {11: 1, 12: 2, 13: 3}, 1: {11: 1, 12: 2, 13: 3}, 2: {21: 1, 23: 3},
            3: {33: 3}}
    for layer, moved in want.items():
        for slot in range(SLOTS):
            got = kv[layer][slot]
            expect = rows[layer][moved[slot]] if slot in moved else before[layer][slot]
            assert torch.equal(got, expect), (layer, slot)


def test_a_segment_keeping_rows_inside_needs_the_window_before_each_end() -> None:
    """``GroupedKV.snapshot``: a segment keeping rows where a hit may end inside it
    (``layout.SegmentLayout``'s ``ends``) needs the sliding group to hold the window
    before each; a plain segment needs its last window only."""
    kv = [torch.zeros((SLOTS, 512), dtype=torch.uint8) for _ in range(3)]
    grouped = GroupedKV(PagedKV(kv, 512), LAYER_GROUP, null_id=0, window_blocks=(0, 0, 1))
    ids: GroupIds = ((10, 11, 12, 13), (0, 0, 22, 23))  # the window freed blocks 0-1
    assert grouped.snapshot(ids, 4) is not None
    assert grouped.snapshot(ids, 4, ends=((3, 3),)) is not None  # rows at block 2
    assert grouped.snapshot(ids, 4, ends=((2, 2),)) is None  # rows at block 1: freed
    assert grouped.snapshot(ids, 4, ends=((1, 1),)) is None  # rows at block 0: freed
