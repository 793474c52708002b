"""Slots of an engine whose layers take their blocks from several block tables (vLLM's
hybrid KV cache manager: one block list per KV cache group, positional, a sliding-window
group's blocks outside its window given as the null block).

FlatCake's executor moves one segment with one slot per block for every layer. For a
model of several groups the worker half runs each task on a scratch paged KV of the
task's blocks (one slot per block, every layer) and moves the bytes between it and the
engine's slots group by group:

    store   ``snapshot``: each layer's blocks gathered from its group's slots when the
            forward pass that computed them ends, before the engine may free a
            sliding-window block (it does so as the window moves, before the request
            finishes); the writer then writes the scratch at its own pace. A block the
            store keeps (of a sliding-window layer: the segment's last window only)
            that its group no longer holds (the null block): no snapshot, no store.
    load    the restore fills the scratch; ``scatter`` then copies each verified block
            into its group's slot, skipping the null block (outside that group's window
            the engine keeps nothing); a sliding-window layer's blocks only within its
            window before the load's end (``LayerGroup.window_blocks``: all the store
            keeps of such a layer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from flatcake.cio.direct import aligned_buffer
from flatcake.cio.paged import PagedKV

GroupIds = tuple[tuple[int, ...], ...]
"""A request's slots in each stored KV cache group (in ``KVGroups`` order), positional."""


@dataclass(frozen=True, slots=True)
class StepSlots:
    """Per request, the slots of its blocks in every stored group for this step's
    tasks: ``loads`` from request block 0, ``stores`` the segment's blocks only."""

    loads: Mapping[str, GroupIds] = field(default_factory=dict)
    stores: Mapping[str, GroupIds] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GroupedKV:
    """The engine's paged KV (``paged``, FlatCake's layer order) and the stored group of
    each of its layers (``layer_group``); ``null_id``: the engine's null block;
    ``window_blocks``: per layer, the blocks a load delivers before its end (0: all)."""

    paged: PagedKV
    layer_group: tuple[int, ...]
    null_id: int = 0
    window_blocks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.layer_group) != self.paged.num_layers or \
                len(self.window_blocks) not in (0, self.paged.num_layers):
            raise ValueError(f"{len(self.layer_group)} layer groups and "
                             f"{len(self.window_blocks)} windows for "
                             f"{self.paged.num_layers} paged KV layers")

    def scratch(self, num_blocks: int) -> PagedKV:
        """A host paged KV of ``num_blocks`` slots of every layer, 4 KiB-aligned."""
        sizes = self.paged.layer_block_bytes
        buf = aligned_buffer(max(num_blocks * sum(sizes), 1), pin=False)
        layers, at = [], 0
        for size in sizes:
            layers.append(buf[at:at + num_blocks * size].view(num_blocks, size))
            at += num_blocks * size
        return PagedKV(layers, sizes, kv_layout="blocks")

    def _table(self, ids: GroupIds, layer: int, lo: int, hi: int) -> list[int]:
        group = ids[self.layer_group[layer]]
        if len(group) < hi:
            raise ValueError(f"group {self.layer_group[layer]} has {len(group)} block ids "
                             f"for {hi} blocks")
        return list(group[lo:hi])

    def _held_from(self, layer: int, num_blocks: int) -> int:
        """The first of ``num_blocks`` blocks the store keeps of ``layer``."""
        window = self.window_blocks[layer] if self.window_blocks else 0
        return max(num_blocks - window, 0) if window else 0

    def snapshot(self, ids: GroupIds, num_blocks: int) -> PagedKV | None:
        """The blocks ``[0, num_blocks)`` of ``ids`` gathered into a scratch paged KV
        (slot ``i`` = block ``i``); None when a group no longer holds a block the store
        keeps."""
        for layer in range(self.paged.num_layers):
            held = self._table(ids, layer, 0, num_blocks)[self._held_from(layer, num_blocks):]
            if self.null_id in held:
                return None
        out = self.scratch(num_blocks)
        dest = out.layer_bytes()
        for layer in range(self.paged.num_layers):
            table = self.paged.block_table(self._table(ids, layer, 0, num_blocks),
                                           unique=False)
            self.paged.gather(layer, table, dest[layer])
        return out

    def scatter(self, scratch: PagedKV, ids: GroupIds, first: int, end: int) -> None:
        """Copy blocks ``[first, end)`` of ``scratch`` into their slots of every group,
        except where a group holds the null block and, for a sliding-window layer,
        before its window's blocks at ``end``."""
        if end <= first:
            return
        src = scratch.layer_bytes()
        # The layers of one group and window take the same blocks into the same slots.
        moves: dict[tuple[int, int], _Move | None] = {}
        for layer in range(self.paged.num_layers):
            skip = max(self._held_from(layer, end) - first, 0)
            key = (self.layer_group[layer], skip)
            if key not in moves:
                moves[key] = self._move(ids, layer, first, end, skip)
            move = moves[key]
            if move is None:
                continue
            size = self.paged.layer_block_bytes[layer]
            rows = src[layer].view(-1, size)[first:end]
            picked = rows[move.rows] if isinstance(move.rows, slice) else \
                rows.index_select(0, move.rows)
            self.paged.scatter(layer, move.table, picked.reshape(-1))

    def _move(self, ids: GroupIds, layer: int, first: int, end: int,
              skip: int) -> _Move | None:
        """Which of blocks ``[first, end)`` go where for ``layer``: those from ``skip``
        on that its group holds (not the null block); None when there are none."""
        slots = self._table(ids, layer, first, end)
        keep = [i for i, s in enumerate(slots) if s != self.null_id and i >= skip]
        if not keep:
            return None
        table = self.paged.block_table([slots[i] for i in keep], unique=True)
        if keep[-1] - keep[0] + 1 == len(keep):  # a run of blocks: a view, no copy
            return _Move(slice(keep[0], keep[-1] + 1), table)
        return _Move(torch.tensor(keep, dtype=torch.int64), table)


@dataclass(frozen=True, slots=True)
class _Move:
    """Blocks of a scratch layer (``rows``, relative to the first block moved) and the
    engine slots they go to (``table``)."""

    rows: slice | torch.Tensor
    table: torch.Tensor

def slots_of(block_ids: Sequence[Sequence[int]], groups: Sequence[int],
             lo: int = 0, hi: int | None = None) -> GroupIds:
    """The slots ``[lo, hi)`` of the stored ``groups`` out of an engine's per-group
    block lists."""
    return tuple(tuple(int(b) for b in block_ids[g][lo:hi]) for g in groups)
