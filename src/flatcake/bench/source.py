"""The bench's KV bytes and paged KV tensors.

The request's blocks live in an "engine" paged KV (one ``(num_slots, block_bytes)``
uint8 tensor per layer, the ``blocks`` layout of ``cio.paged``, allocated like the
restore destination: page-aligned, huge pages from 2 MiB up), request block ``i`` in
slot ``i``; FlatCake writes its turns from there (straight from the slots, see
``cio.writer``) and every baseline is written from the same bytes. Every restore lands
in a second paged KV at shuffled slots, so the scatter is real and a block restored
into the wrong slot, or from the wrong layer, is caught.

Bytes are random but cheap to make: a 64 MiB random pool tiled with a per-layer
rotation, and the first 8 bytes of every block stamped with ``(layer << 32) | block``,
so no two (block, layer) pairs are equal.
"""

from __future__ import annotations

import torch

from flatcake.cio.direct import aligned_buffer

POOL_BYTES = 64 << 20


def layer_sizes(num_layers: int, block_bytes: int | tuple[int, ...]) -> tuple[int, ...]:
    """One block size per layer: ``block_bytes`` for every layer, or as given (a model
    whose layers differ in size)."""
    sizes = block_bytes if isinstance(block_bytes, tuple) else (block_bytes,) * num_layers
    if len(sizes) != num_layers:
        raise ValueError(f"{len(sizes)} layer sizes for {num_layers} layers")
    return sizes


def make_kv(num_layers: int, num_blocks: int, block_bytes: int | tuple[int, ...], *,
            seed: int = 0) -> list[torch.Tensor]:
    """``num_layers`` tensors ``(num_blocks, block_bytes)`` uint8 of distinct blocks
    (``block_bytes``: one size, or one per layer)."""
    sizes = layer_sizes(num_layers, block_bytes)
    if num_layers < 1 or num_blocks < 1 or min(sizes) < 8:
        raise ValueError(f"make_kv needs num_layers >= 1, num_blocks >= 1, block_bytes >= 8; "
                         f"got {num_layers}, {num_blocks}, {block_bytes}")
    gen = torch.Generator().manual_seed(seed)
    pool = torch.empty(POOL_BYTES // 8, dtype=torch.int64).random_(generator=gen)
    pool_bytes = pool.view(torch.uint8)
    size = pool_bytes.numel()
    stamps = torch.arange(num_blocks, dtype=torch.int64)
    out = []
    for layer, size_bytes in enumerate(sizes):
        t = aligned_buffer(num_blocks * size_bytes, pin=False).view(num_blocks, size_bytes)
        flat = t.view(-1)
        pos, start = 0, (layer * 7919 * 4096) % size
        while pos < flat.numel():
            n = min(size - start, flat.numel() - pos)
            flat[pos:pos + n].copy_(pool_bytes[start:start + n])
            pos, start = pos + n, 0
        t[:, :8].view(torch.int64)[:, 0] = stamps + (layer << 32)
        out.append(t)
    return out


def empty_kv(num_layers: int, num_slots: int, block_bytes: int | tuple[int, ...]
             ) -> list[torch.Tensor]:
    """A zeroed destination paged KV (pages touched now, not inside a timed restore),
    page-aligned and, from 2 MiB up, in transparent huge pages (``direct.
    aligned_buffer``), as an engine's allocator can give it: FlatCake then reads
    straight into the slots; the baselines copy into the same tensors."""
    return [aligned_buffer(num_slots * size, pin=False).zero_().view(num_slots, size)
            for size in layer_sizes(num_layers, block_bytes)]


def shuffled_slots(num_blocks: int, num_slots: int, *, seed: int = 1) -> torch.Tensor:
    """A block table: ``num_blocks`` distinct slots of ``[0, num_slots)`` in random order."""
    if num_slots < num_blocks:
        raise ValueError(f"num_slots {num_slots} < num_blocks {num_blocks}")
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(num_slots, generator=gen)[:num_blocks].contiguous()


def shifted_table(base: torch.Tensor, index: int, num_slots: int) -> torch.Tensor:
    """The block table of restore number ``index``: block ``i`` goes to slot
    ``(base[i] + index) % num_slots``. For ``index`` < ``num_slots`` no block lands where
    another restore put it, so (blocks being distinct) leftovers of earlier restores never
    match what this one must deliver and the destination needs no zeroing."""
    if not 0 <= index < num_slots:
        raise ValueError(f"restore index must be in [0, {num_slots}), got {index}")
    return (base + index) % num_slots
