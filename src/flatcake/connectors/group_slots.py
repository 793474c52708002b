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

A group whose block is smaller than FlatCake's (DeepSeek-V4 under vLLM: 4-, 8- and
64-token blocks beside 256-token ones) gives each FlatCake block of its layers several
engine blocks (``EnginePages``); a sliding-window layer keeps only the last engine blocks
of a FlatCake block that its window reaches, so its stored block is those pages alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from flatcake.cio.direct import aligned_buffer
from flatcake.cio.paged import PagedKV
from flatcake.layout import held_runs

GroupIds = tuple[tuple[int, ...], ...]
"""A request's slots in each stored KV cache group (in ``KVGroups`` order), positional."""


@dataclass(frozen=True, slots=True)
class EnginePages:
    """How one layer's FlatCake block lies in its group's engine blocks: ``per_block``
    engine blocks of ``page_bytes`` each make one FlatCake block, of which the store
    keeps the last ``kept`` (all of them, or a sliding window's tail); ``content``: the
    bytes of each page the store keeps, its first (a recurrent state's arrays before
    vLLM pads its page to the attention page; 0: the whole page)."""

    page_bytes: int
    per_block: int = 1
    kept: int = 1
    content: int = 0

    def __post_init__(self) -> None:
        if self.page_bytes <= 0 or not 0 < self.kept <= self.per_block or \
                not 0 <= self.content <= self.page_bytes:
            raise ValueError(f"engine pages of {self.page_bytes} B ({self.content} B "
                             f"content), {self.kept} kept of {self.per_block} per block")

    @property
    def stored_bytes(self) -> int:
        """Bytes of one engine page as stored."""
        return self.content or self.page_bytes

    @property
    def block_bytes(self) -> int:
        """Bytes of one FlatCake block of the layer as stored."""
        return self.stored_bytes * self.kept

    def ids(self, group: Sequence[int], lo: int, hi: int) -> list[int]:
        """The engine blocks kept of FlatCake blocks ``[lo, hi)`` out of a group's
        positional block list, block-major."""
        k, skip = self.per_block, self.per_block - self.kept
        return [b for i in range(lo, hi) for b in group[i * k + skip:(i + 1) * k]]


@dataclass(frozen=True, slots=True)
class StepSlots:
    """Per request, the slots of its blocks in every stored group for this step's
    tasks: ``loads`` from request block 0, ``stores`` the segment's blocks only."""

    loads: Mapping[str, GroupIds] = field(default_factory=dict)
    stores: Mapping[str, GroupIds] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GroupedKV:
    """The engine's paged KV (``paged``, FlatCake's layer order, one slot per engine
    block) and the stored group of each of its layers (``layer_group``); ``null_id``:
    the engine's null block; ``window_blocks``: per layer, the blocks a load delivers
    before its end (0: all); ``pages``: per layer, its engine blocks per FlatCake block
    (empty: one each, whole)."""

    paged: PagedKV
    layer_group: tuple[int, ...]
    null_id: int = 0
    window_blocks: tuple[int, ...] = ()
    pages: tuple[EnginePages, ...] = ()

    def __post_init__(self) -> None:
        n = self.paged.num_layers
        if len(self.layer_group) != n or len(self.window_blocks) not in (0, n) or \
                len(self.pages) not in (0, n):
            raise ValueError(f"{len(self.layer_group)} layer groups, "
                             f"{len(self.window_blocks)} windows and {len(self.pages)} "
                             f"page maps for {n} paged KV layers")
        if not self.pages:
            object.__setattr__(self, "pages", tuple(
                EnginePages(size) for size in self.paged.layer_block_bytes))
        for layer, (pages, size) in enumerate(zip(self.pages, self.paged.layer_block_bytes,
                                                  strict=True)):
            if pages.page_bytes != size:
                raise ValueError(f"layer {layer}: engine pages of {size} B, "
                                 f"{pages.page_bytes} B expected")

    def scratch(self, num_blocks: int) -> PagedKV:
        """A host paged KV of ``num_blocks`` FlatCake blocks of every layer (as stored),
        4 KiB-aligned."""
        sizes = tuple(pages.block_bytes for pages in self.pages)
        buf = aligned_buffer(max(num_blocks * sum(sizes), 1), pin=False)
        layers, at = [], 0
        for size in sizes:
            layers.append(buf[at:at + num_blocks * size].view(num_blocks, size))
            at += num_blocks * size
        return PagedKV(layers, sizes, kv_layout="blocks")

    def _table(self, ids: GroupIds, layer: int, lo: int, hi: int) -> list[int]:
        """The engine blocks kept of FlatCake blocks ``[lo, hi)`` of ``layer``."""
        group, pages = ids[self.layer_group[layer]], self.pages[layer]
        if len(group) < hi * pages.per_block:
            raise ValueError(f"group {self.layer_group[layer]} has {len(group)} block ids "
                             f"for {hi} blocks of {pages.per_block}")
        return pages.ids(group, lo, hi)

    def _held(self, layer: int, num_blocks: int,
              ends: tuple[tuple[int, int], ...] = ()) -> tuple[tuple[int, int], ...]:
        """The blocks ``[a, b)`` of ``num_blocks`` the store keeps of ``layer`` (with
        hits ending at ``ends`` too: ``layout.held_runs``)."""
        return held_runs(num_blocks, self.window_blocks[layer] if self.window_blocks else 0,
                         ends)

    def _held_from(self, layer: int, num_blocks: int) -> int:
        """The first of ``num_blocks`` blocks a window at their end keeps of ``layer``."""
        return self._held(layer, num_blocks)[0][0]

    def snapshot(self, ids: GroupIds, num_blocks: int,
                 ends: tuple[tuple[int, int], ...] = ()) -> PagedKV | None:
        """The blocks ``[0, num_blocks)`` of ``ids`` gathered into a scratch paged KV
        (slot ``i`` = block ``i``); None when a group no longer holds a block the store
        keeps (with hits ending at ``ends`` too: ``layout.SegmentLayout``)."""
        for layer in range(self.paged.num_layers):
            for lo, hi in self._held(layer, num_blocks, ends):
                if self.null_id in self._table(ids, layer, lo, hi):
                    return None
        out = self.scratch(num_blocks)
        dest = out.layer_bytes()
        for layer in range(self.paged.num_layers):
            table = self.paged.block_table(self._table(ids, layer, 0, num_blocks),
                                           unique=False)
            self.paged.gather(layer, table, dest[layer], self.pages[layer].content)
        return out

    def scatter(self, scratch: PagedKV, ids: GroupIds, first: int, end: int) -> None:
        """Copy blocks ``[first, end)`` of ``scratch`` into their slots of every group,
        except where a group holds the null block and, for a sliding-window layer,
        before its window's blocks at ``end``."""
        if end <= first:
            return
        src = scratch.layer_bytes()
        # The layers of one group and window take the same blocks into the same slots.
        moves: dict[tuple[int, int, int, int], _Move | None] = {}
        for layer in range(self.paged.num_layers):
            pages = self.pages[layer]
            skip = max(self._held_from(layer, end) - first, 0)
            key = (self.layer_group[layer], skip, pages.per_block, pages.kept)
            if key not in moves:
                moves[key] = self._move(ids, layer, first, end, skip * pages.kept)
            move = moves[key]
            if move is None:
                continue
            size = pages.stored_bytes
            rows = src[layer].view(-1, size)[first * pages.kept:end * pages.kept]
            picked = rows[move.rows] if isinstance(move.rows, slice) else \
                rows.index_select(0, move.rows)
            self.paged.scatter(layer, move.table, picked.reshape(-1), pages.content)

    def _move(self, ids: GroupIds, layer: int, first: int, end: int,
              skip: int) -> _Move | None:
        """Which engine blocks of FlatCake blocks ``[first, end)`` go where for
        ``layer``: those from the ``skip``-th on that its group holds (not the null
        block); None when there are none."""
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
             lo: int = 0, hi: int | None = None, per_block: Sequence[int] = ()
             ) -> GroupIds:
    """The slots of FlatCake blocks ``[lo, hi)`` of the stored ``groups`` out of an
    engine's per-group block lists; ``per_block``: each group's engine blocks in one
    FlatCake block (empty: one)."""
    out = []
    for i, g in enumerate(groups):
        k = per_block[i] if per_block else 1
        out.append(tuple(int(b) for b in block_ids[g][lo * k:None if hi is None
                                                       else hi * k]))
    return tuple(out)
