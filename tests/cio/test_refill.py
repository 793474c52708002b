"""Memory copies a restore fills layer by layer (``cio.refill``): a copy is reported
written only when every layer of it landed whole before the restore's cut and its
segment passed its checks; its bytes are the segment's blocks in the memory layout."""

from __future__ import annotations

import torch

from flatcake.cio.arena import ArenaBuffer
from flatcake.cio.paged import PagedKV
from flatcake.cio.refill import LayerRefills
from flatcake.plan.tasks import LoadTask
from flatcake.readplan import ReadPlan

LAYERS, SLOTS, BBPL = 3, 16, 4096


def _task(refills: tuple[tuple[int, int, int, int, int], ...]) -> LoadTask:
    return LoadTask("r", ReadPlan((), 6, BBPL, 0, 0, 0, 0, 0, 0), (), (), (),
                    tuple(range(10, 16)), 6, 0, False,
                    refills)


def _paged() -> PagedKV:
    g = torch.Generator().manual_seed(5)
    kv = [torch.randint(0, 256, (SLOTS, BBPL), dtype=torch.uint8, generator=g)
          for _ in range(LAYERS)]
    return PagedKV(kv, BBPL, "blocks")


def test_every_layer_copied_in_the_memory_layout() -> None:
    paged, arena = _paged(), ArenaBuffer(1 << 20)
    nbytes = LAYERS * 2 * BBPL
    refills = LayerRefills(_task(((7, 4, 2, 8192, nbytes),)), paged, arena)
    for layer in range(LAYERS):
        assert refills.written(6, ()) == ()  # not every layer yet
        refills.after_layer(layer, 6)
    assert refills.written(6, ()) == (7,)
    for layer in range(LAYERS):
        for j, slot in enumerate((14, 15)):  # request blocks 4, 5
            at = 8192 + (layer * 2 + j) * BBPL
            assert torch.equal(arena.view(at, BBPL), paged.layer_bytes()[layer]
                               .view(SLOTS, BBPL)[slot])


def test_a_cut_or_failed_check_leaves_the_copy_out() -> None:
    paged, arena = _paged(), ArenaBuffer(1 << 20)
    nbytes = LAYERS * 2 * BBPL
    task = _task(((1, 0, 2, 0, nbytes), (2, 2, 2, nbytes, nbytes), (3, 4, 2, 2 * nbytes,
                                                                       nbytes)))
    refills = LayerRefills(task, paged, arena)
    refills.after_layer(0, 6)
    refills.after_layer(1, 4)  # a check of segment 3 failed at layer 1: cut at block 4
    refills.after_layer(2, 4)
    assert refills.written(4, (3,)) == (1, 2)
    assert refills.written(4, (1, 3)) == (2,)
    assert refills.written(2, (3,)) == (1,)
