"""DeepSeek-V4's KV cache groups through the connector's two halves, without vLLM's
engine: the groups and page sizes vLLM 0.32 makes of a five-layer DeepSeek-V4 (``dsv4_kv``:
64-, 256-, 4- and 8-token blocks, an MLA layer and its indexer in one group), a turn
stored from each group's blocks and restored in a fresh process into other slots, byte for
byte; a sliding window's pages only those its window reaches, the null block never
written. Runs where vLLM is installed (``.venv-engine``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.connectors.dsv4_kv import dsv4_flash

pytest.importorskip("vllm")

from flatcake.cio.direct import aligned_buffer
from flatcake.connectors.group_slots import StepSlots, slots_of
from flatcake.connectors.scheduler_side import RequestView, SchedulerSide
from flatcake.connectors.vllm_glue import KVGroups, engine_geometry, group_tensors
from flatcake.connectors.worker_side import WorkerSide
from flatcake.control.keys import chain_block_keys
from tests.connectors.sides_harness import grouped_step, settings

RATIOS = (0, 4, 128, 4, 128)
SLOTS = 200
NULL = 0


class Engine:
    """A scheduler half, a worker half and a paged KV of random bytes, each layer one
    tensor of its own page size (vLLM's per-layer views)."""

    def __init__(self, root: Path, seed: int, bounded: bool) -> None:
        stand_in, config = dsv4_flash(bounded, memory=1 << 26, ratios=RATIOS)
        self.kv_groups = KVGroups.of(config)
        self.g = engine_geometry(stand_in, config)
        s = settings("store.memory_capacity_bytes=0", "store.ssd_capacity_bytes=268435456",
                     "store.session_file_bytes=67108864")
        self.worker = WorkerSide(self.g, s, root)
        self.sched = SchedulerSide(self.g, s, root, async_loads=True)
        gen = torch.Generator().manual_seed(seed)
        self.kv = []
        for pages in self.kv_groups.pages:
            t = aligned_buffer(SLOTS * pages.page_bytes, pin=False).view(SLOTS, -1)
            self.kv.append(t.copy_(torch.randint(0, 256, t.shape, generator=gen,
                                                 dtype=torch.uint8)))
        self.worker.register(self.kv, self.kv_groups.layer_group, NULL,
                             pages=self.kv_groups.pages)

    def block_lists(self, first_id: int, num_blocks: int) -> tuple[list[int], ...]:
        """Per stored group, positional: ``num_blocks`` FlatCake blocks of engine blocks,
        a sliding window's blocks before its reach at the end the null block."""
        out, next_id = [], first_id
        for i, k in enumerate(self.kv_groups.per_block):
            kept = next(p.kept for p, grp in zip(self.kv_groups.pages,
                                                 self.kv_groups.layer_group, strict=True)
                        if grp == i)
            ids = []
            for pos in range(num_blocks * k):
                held = kept == k or pos >= num_blocks * k - kept
                ids.append(next_id if held else NULL)
                next_id += held
            out.append(ids)
        assert next_id <= SLOTS
        return tuple(out)

    def run(self, slots: StepSlots) -> tuple[set[str], set[str]]:
        return grouped_step(self.worker, self.sched, slots)

    def close(self) -> None:
        self.worker.close()
        self.sched.close()


def _view(rid: str, toks: list[int], bs: int, computed: int = 0) -> RequestView:
    return RequestView(rid, tuple(chain_block_keys(toks, bs, "dsv4")), len(toks), len(toks),
                       0, computed, "s")


@pytest.mark.parametrize("bounded", [False, True])
def test_a_turn_comes_back_into_each_groups_slots_byte_for_byte(tmp_path: Path,
                                                                bounded: bool) -> None:
    a = Engine(tmp_path, seed=1, bounded=bounded)
    bs, stored = a.g.tokens_per_block, a.kv_groups.stored
    assert (bs, a.kv_groups.per_block[-2:]) == (256, (64, 32))
    turn0 = list(range(1000, 1000 + 2 * bs + 1))
    v0 = _view("a", turn0, bs, computed=len(turn0))
    a.sched.num_matched_tokens(v0, 0)
    lists = a.block_lists(1, 2)
    plan = a.sched.prompt_computed(v0, lists[stored.index(a.kv_groups.plan_group)])
    assert plan is not None and plan.segment.num_blocks == 2
    a.sched.request_finished(v0)
    a.run(StepSlots(stores={"a": slots_of(lists, range(len(stored)), 0, 2,
                                          a.kv_groups.per_block)}))
    assert a.sched.totals()["stores_ok"] == 1
    before = [t.clone() for t in a.kv]
    a.close()

    b = Engine(tmp_path, seed=2, bounded=bounded)  # a fresh process, other bytes
    v1 = _view("b", [*turn0, *range(5000, 5100)], bs)
    assert b.sched.num_matched_tokens(v1, 0) == (2 * bs, True)
    into = b.block_lists(SLOTS // 2, 2)
    b.sched.after_alloc("b", into[stored.index(b.kv_groups.plan_group)], 2 * bs)
    untouched = [t.clone() for t in b.kv]
    recving, failed = b.run(StepSlots(loads={"b": slots_of(into, range(len(stored)),
                                                         per_block=b.kv_groups.per_block)}))
    assert (recving, failed) == ({"b"}, set())
    # No DeepSeek-V4 page is a multiple of 4 KiB: the restore went through staging.
    assert b.sched.totals()["loads_staged"] == 1
    moved = 0
    for layer, group in enumerate(b.kv_groups.layer_group):
        src, dst = lists[group], into[group]
        expect = untouched[layer].clone()
        for s, d in zip(src, dst, strict=True):
            if d != NULL:
                expect[d] = before[layer][s]
                moved += 1
        assert torch.equal(b.kv[layer], expect), f"layer {layer} ({b.kv_groups.layers[layer]})"
    # Every page the groups hold: whole blocks of group 2, each window's reach.
    assert moved == sum(2 * p.kept if p.kept < p.per_block else 2 * p.per_block
                        for p in b.kv_groups.pages) - sum(
        p.kept for p in b.kv_groups.pages if p.kept < p.per_block)
    b.close()


def test_layers_packed_into_one_block_are_refused_at_start_naming_the_layer() -> None:
    # vLLM's block-outermost layout: each block holds every layer's page in turn, so a
    # layer's tensor is a strided view; FlatCake reads a layer's pages one after another.
    _, config = dsv4_flash(False, memory=1 << 26, ratios=RATIOS)
    kv = KVGroups.of(config)
    alone = {name: torch.zeros(4, p.page_bytes, dtype=torch.uint8)
             for name, p in zip(kv.layers, kv.pages, strict=True)}
    assert len(group_tensors(kv, alone)) == len(kv.layers)
    first, second = kv.layers[:2]
    page = kv.pages[0].page_bytes
    packed = torch.zeros(4, 2 * page, dtype=torch.uint8)
    with pytest.raises(ValueError, match=re.escape(
            f"cannot read layer {first}'s KV blocks: vLLM laid them out as shape (4, {page}), "
            f"stride ({2 * page}, 1)")):
        group_tensors(kv, alone | {first: packed[:, :page], second: packed[:, page:]})
    padded = torch.zeros(4, page - 64, dtype=torch.uint8)
    with pytest.raises(ValueError, match=f"holds {page - 64} bytes per block"):
        group_tensors(kv, alone | {first: padded})
