"""The peers' on-disk layouts, written with real bytes, and the restore each one needs.

Both baselines hold exactly the blocks FlatCake holds for the restored request, and
both are read by ``program.run_program`` with FlatCake's own reader, so the only
difference measured is the layout.

``scattered`` — a tiered store's SSD tier filled by demotion (eviction order):

- *Per-layer objects.* Layer-wise KV stores key each chunk's layers separately so a
  restore can feed prefill layer by layer: LMCache's ``use_layerwise`` mode splits a
  chunk key into one ``LayerCacheEngineKey`` per layer (``CacheEngineKey.split_layers``
  in ``lmcache/utils.py``), and the Mooncake store connector does the same with
  ``LayerMoonCakeEngineKey``. So one object = one block of one layer.
- *Eviction order, sessions interleaved.* Demotion writes blocks when memory evicts
  them, not when their session wrote them. Sessions run concurrently, so the LRU order
  interleaves their blocks; ``num_sessions`` sessions are interleaved round-robin, one
  block (all of its layer objects) at a time.
- *Buckets.* Mooncake's SSD offload (``BucketStorageBackend::BatchOffload`` /
  ``BuildBucket`` in ``mooncake-store/src/storage_backend.cpp``) packs each offload
  batch into one bucket file of at most ``bucket_keys_limit`` = 500 objects and
  ``bucket_size_limit`` = 256 MiB (``BucketBackendConfig`` in
  ``mooncake-store/include/storage_backend.h``), in the iteration order of an
  ``unordered_map`` -- a hash order, modelled here by a seeded shuffle per bucket.
- *Reads.* ``BucketStorageBackend::BatchLoad`` issues one read per object. A layer-wise
  restore therefore reads, for layer ``l``, every block's layer-``l`` object: one
  command per block per layer, into the same two-layer staging window FlatCake uses.
- *In the baseline's favour:* Mooncake stores each object's key bytes in front of its
  data, so its O_DIRECT reads round out to 4 KiB and read extra bytes; here every
  object starts 4 KiB aligned and is read exactly. File descriptors are opened once.

``per-chunk-files`` — LMCache's local disk backend (``LocalDiskBackend`` in
``lmcache/v1/storage_backend/local_disk_backend.py``: "one file per KV cache chunk",
``chunk_size`` 256 tokens by default, optional O_DIRECT) and SGLang's ``HiCacheFile``
(``python/sglang/srt/mem_cache/hicache_storage.py``: one ``<key>.bin`` per page of all
layers). One file per chunk of ``chunk_tokens`` tokens, all layers inside (layer-major
here), read chunk by chunk: open, one read of the whole file, scatter every layer. A
chunk holds all layers, so its staging buffer is a whole chunk, not two layers.
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from flatcake.bench.program import FileRead, ReadPass, RestoreProgram, ScatterRun
from flatcake.bench.source import make_kv
from flatcake.cio.direct import aligned_buffer, writable_view
from flatcake.layout import ALIGN, align_up

MOONCAKE_BUCKET_KEYS_LIMIT = 500
MOONCAKE_BUCKET_SIZE_LIMIT_BYTES = 256 * 1024 * 1024
LMCACHE_CHUNK_TOKENS = 256
FILLER_POOL_BLOCKS = 64


@dataclass(frozen=True, slots=True)
class ScatteredConfig:
    """Shape of the eviction-order tier.

    Attributes:
        num_sessions: sessions whose blocks are interleaved in demotion order (the
            restored one included); the other sessions' blocks are real random bytes.
        bucket_keys_limit: objects per bucket file (Mooncake default 500).
        bucket_size_limit_bytes: bytes per bucket file (Mooncake default 256 MiB).
        seed: seeds the in-bucket hash order and the other sessions' bytes.
    """

    num_sessions: int = 3
    bucket_keys_limit: int = MOONCAKE_BUCKET_KEYS_LIMIT
    bucket_size_limit_bytes: int = MOONCAKE_BUCKET_SIZE_LIMIT_BYTES
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_sessions < 1:
            raise ValueError(f"scattered num_sessions must be >= 1, got {self.num_sessions}")
        if self.bucket_keys_limit < 1:
            raise ValueError(
                f"scattered bucket_keys_limit must be >= 1, got {self.bucket_keys_limit}")
        if self.bucket_size_limit_bytes < ALIGN:
            raise ValueError(f"scattered bucket_size_limit_bytes must be >= {ALIGN}, got "
                             f"{self.bucket_size_limit_bytes}")


def _check_source(source: Sequence[torch.Tensor]) -> tuple[int, tuple[int, ...]]:
    """``(num_blocks, each layer's block bytes)``."""
    if not source:
        raise ValueError("source must hold one (num_blocks, block_bytes) tensor per layer")
    num_blocks = source[0].shape[0]
    for layer, t in enumerate(source):
        if t.dtype != torch.uint8 or t.dim() != 2 or t.shape[0] != num_blocks:
            raise ValueError(f"source[{layer}] must be uint8 ({num_blocks}, block_bytes), "
                             f"got {t.dtype} {tuple(t.shape)}")
    if num_blocks == 0:
        raise ValueError("source holds no blocks")
    return int(num_blocks), tuple(int(t.shape[1]) for t in source)


def _write_file(path: str, buf: torch.Tensor) -> None:
    """Create ``path`` (0600) and write ``buf`` (aligned, 4 KiB multiple) with O_DIRECT."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT | os.O_CLOEXEC,
                 0o600)
    try:
        view = writable_view(buf)
        done = 0
        while done < len(view):
            n = os.pwrite(fd, view[done:], done)
            if n <= 0:
                raise OSError(f"short write to {path} at {done}")
            done += n
        os.fsync(fd)
    finally:
        os.close(fd)


def write_scattered(directory: str, source: Sequence[torch.Tensor],
                    config: ScatteredConfig | None = None) -> RestoreProgram:
    """Demote the request's blocks (``source[l][i]``: block ``i`` of layer ``l``) and
    those of ``num_sessions - 1`` other sessions into bucket files under ``directory``;
    return the layer-by-layer restore of the request."""
    cfg = config or ScatteredConfig()
    num_blocks, sizes = _check_source(source)
    num_layers = len(source)
    slots = [align_up(b) for b in sizes]  # each object starts 4 KiB aligned
    os.makedirs(directory, mode=0o700, exist_ok=True)
    rng = random.Random(cfg.seed)
    # The other sessions' objects: slices of a random pool (never read back, only
    # there to occupy their places in the buckets; incompressible all the same).
    pools = {b: make_kv(1, FILLER_POOL_BLOCKS, b, seed=cfg.seed + 1)[0].numpy()
             for b in set(sizes)}
    # Many small copies go through numpy: a torch copy of a 64 KiB row is an intra-op
    # parallel region, which costs milliseconds when the other core is busy.
    src_rows = [t.numpy() for t in source]

    # Demotion order: round-robin over sessions, one block (all layer objects) each.
    # Session 0 is the restored request. An object is (session, block, layer).
    order: list[tuple[int, int, int]] = []
    for block in range(num_blocks):
        for session in range(cfg.num_sessions):
            order.extend((session, block, layer) for layer in range(num_layers))
    buckets: list[list[tuple[int, int, int]]] = [[]]
    bucket_bytes = 0
    for obj in order:
        size = slots[obj[2]]
        if buckets[-1] and (len(buckets[-1]) >= cfg.bucket_keys_limit
                            or bucket_bytes + size > cfg.bucket_size_limit_bytes):
            buckets.append([])
            bucket_bytes = 0
        buckets[-1].append(obj)
        bucket_bytes += size

    where: dict[tuple[int, int], tuple[str, int]] = {}  # (block, layer) -> (path, offset)
    files_bytes = 0
    num_filler = 0
    # One buffer for every bucket: its pages are faulted in once, not once per bucket.
    bucket_buf = aligned_buffer(max(sum(slots[o[2]] for o in b) for b in buckets))
    for bucket_id, objects in enumerate(buckets):
        rng.shuffle(objects)  # unordered_map iteration order inside one bucket
        path = os.path.join(directory, f"bucket-{bucket_id:06d}.bin")
        buf = bucket_buf[:sum(slots[o[2]] for o in objects)]
        flat = buf.numpy()
        at = 0
        for session, block, layer in objects:
            b = sizes[layer]
            if session == 0:
                flat[at:at + b] = src_rows[layer][block]
                where[(block, layer)] = (path, at)
            else:
                flat[at:at + b] = pools[b][num_filler % FILLER_POOL_BLOCKS]
                num_filler += 1
            flat[at + b:at + slots[layer]] = 0
            at += slots[layer]
        _write_file(path, buf)
        files_bytes += buf.numel()

    passes = []
    for layer, slot in enumerate(slots):
        reads = tuple(FileRead(*where[(block, layer)], slot, block * slot)
                      for block in range(num_blocks))
        passes.append(ReadPass(reads=reads,
                               runs=(ScatterRun(layer, 0, num_blocks, 0, slot),),
                               staging_bytes=num_blocks * slot))
    return RestoreProgram("scattered", tuple(passes), files_bytes=files_bytes)


def write_per_chunk_files(directory: str, source: Sequence[torch.Tensor], *,
                          blocks_per_chunk: int) -> RestoreProgram:
    """One file per chunk of ``blocks_per_chunk`` blocks (the last may be shorter), all
    layers inside, layer-major; return the chunk-by-chunk restore."""
    if blocks_per_chunk < 1:
        raise ValueError(f"blocks_per_chunk must be >= 1, got {blocks_per_chunk}")
    num_blocks, sizes = _check_source(source)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    src_rows = [t.numpy() for t in source]
    passes = []
    files_bytes = 0
    for chunk, first in enumerate(range(0, num_blocks, blocks_per_chunk)):
        n = min(blocks_per_chunk, num_blocks - first)
        starts = [0, *itertools.accumulate(n * b for b in sizes)]  # layer-major
        size = align_up(starts[-1])
        buf = aligned_buffer(size)
        flat = buf.numpy()
        flat[starts[-1]:] = 0
        for layer, rows in enumerate(src_rows):
            flat[starts[layer]:starts[layer + 1]] = rows[first:first + n].reshape(-1)
        path = os.path.join(directory, f"chunk-{chunk:06d}.bin")
        _write_file(path, buf)
        files_bytes += size
        runs = tuple(ScatterRun(layer, first, n, starts[layer], b)
                     for layer, b in enumerate(sizes))
        passes.append(ReadPass(reads=(FileRead(path, 0, size, 0),), runs=runs,
                               staging_bytes=size))
    return RestoreProgram("per-chunk-files", tuple(passes), open_per_pass=True,
                          files_bytes=files_bytes)
