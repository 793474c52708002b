"""The device ceiling *into the paged KV*: the device file read with the same commands as
the ``device`` row, but each command's bytes land in the engine's paged KV slots.

A zero-copy restore cannot avoid this cost: the paged KV is the destination, and its
blocks sit in arbitrary slots (K and V halves in separate planes for a ``kv_blocks``
layout), so each command is a ``preadv`` with one iovec per block part instead of one
contiguous buffer. Some devices (virtual disks in particular) move scattered iovec lists
markedly slower than one buffer; this row measures that on the disk under test, so the
report can tell the destination's cost apart from FlatCake's own::

    device file  |chunk 0          |chunk 1          | ...   (chunk_bytes each)
                   blk0 blk1 ...     (block b of layer l = file block l * num_blocks + b)
    paged KV     layer l: slot table[b] <- block b   (K half -> plane 0, V half -> plane 1)

The bytes read are the device file's, not the request's: only the addresses matter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from flatcake.cio.paged import PagedKV
from flatcake.cio.readers import IOV_MAX, Reader
from flatcake.cio.zerocopy import SlotViews, zero_copy_refusal

Destination = Callable[[int], Sequence[memoryview]]


def paged_chunk_bytes(paged: PagedKV, chunk_bytes: int) -> int:
    """The command size of the paged row: whole blocks, at most ``chunk_bytes`` (0 when a
    block is larger)."""
    return chunk_bytes // paged.layer_block_bytes[0] * paged.layer_block_bytes[0]


def paged_destination(reader: Reader, paged: PagedKV, table: torch.Tensor,
                      chunk_bytes: int, num_chunks: int) -> tuple[Destination | None, str]:
    """``(destination, "")``: chunk ``i`` (``chunk_bytes`` each, whole blocks: see
    ``paged_chunk_bytes``) -> the iovecs of the paged KV slots its blocks would go to;
    or ``(None, why)`` where a zero-copy restore into ``paged`` is refused or a chunk is
    not whole blocks within ``IOV_MAX`` iovecs."""
    bbl = paged.layer_block_bytes[0]
    why = zero_copy_refusal(reader, paged, True)
    if not why and not paged.uniform:
        why = "the layers' blocks differ in size (one command size cannot be whole blocks)"
    if not why and (chunk_bytes <= 0 or chunk_bytes % bbl):
        why = f"a {chunk_bytes}-byte command is not whole {bbl}-byte blocks"
    parts = 2 if paged.kv_layout == "kv_blocks" else 1
    per_chunk = chunk_bytes // bbl
    if not why and per_chunk * parts > IOV_MAX:
        why = f"{per_chunk * parts} iovecs per command exceed IOV_MAX ({IOV_MAX})"
    if why:
        return None, why
    views = SlotViews(paged)
    slots = table.tolist()
    num_blocks, num_layers = len(slots), paged.num_layers
    iovecs: list[list[memoryview]] = []
    for i in range(num_chunks):
        iov: list[memoryview] = []
        for g in range(i * per_chunk, (i + 1) * per_chunk):
            layer = (g // num_blocks) % num_layers
            iov.extend(views.block(layer, slots[g % num_blocks]))
        iovecs.append(iov)
    return iovecs.__getitem__, ""
