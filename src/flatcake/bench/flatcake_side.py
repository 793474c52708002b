"""FlatCake itself in the bench: a real ``FlatCakeStore`` on the disk under test.

The session's turns are written with ``store_turn`` (one layer-major segment per turn,
O_DIRECT commands in flight straight from the engine's paged KV slots, or gathered
when they are not aligned, fdatasync once per turn) and restored with ``load``
(lookup, read planning with merges, the store's ``DirectReader``, the two-layer staging
window with per-layer crc32 checks, scatter into the paged KV). Nothing is bypassed:
the bench times exactly what an engine calling the store would wait for.

Every turn goes to SSD: the host arena is given no capacity, so placement answers
``memory_full`` (the bench measures SSD restores; memory hits are copies).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from flatcake.bench.control_cost import session_keys, split_turns, time_prepare_load
from flatcake.bench.program import ProgramRun
from flatcake.cio.paged import PagedKV
from flatcake.cio.writer import zero_copy_write_refusal
from flatcake.config import FlatCakeConfig, StoreConfig
from flatcake.control.address import Medium
from flatcake.geometry import KVGeometry
from flatcake.plan.reads import plan_reads
from flatcake.store.results import TurnSignals
from flatcake.store.store import FlatCakeStore

GIB = 1 << 30
SESSION_ID = "bench-session"


class FlatcakeSide:
    """One store holding one session of ``len(source[0])`` blocks in ``num_turns`` turns.

    ``source[l]``: ``(num_blocks, block_bytes_per_layer)`` uint8, the engine's paged KV
    of layer ``l`` at write time (request block ``i`` in slot ``i``).
    """

    def __init__(self, root: str, geometry: KVGeometry, source: Sequence[torch.Tensor], *,
                 num_turns: int, read_threads: int, seed: int = 0) -> None:
        self.geometry = geometry
        self.source = list(source)
        self.num_blocks = int(source[0].shape[0])
        self.turns = split_turns(self.num_blocks, num_turns)
        self.keys = session_keys(geometry, self.num_blocks, seed=seed)
        need = geometry.kv_bytes(self.num_blocks * geometry.tokens_per_block)
        store_cfg = StoreConfig(
            root=root, io_mode="direct", read_threads=read_threads,
            memory_capacity_bytes=0,
            ssd_capacity_bytes=max(64 * GIB, 2 * need + GIB),
            session_file_bytes=max(64 * GIB, -(-(2 * need + GIB) // 4096) * 4096),
        )
        self.store = FlatCakeStore.open(root, geometry, FlatCakeConfig(store=store_cfg))
        self.read_paths: set[str] = set()  # LoadResult.read_path of each restore
        refusal = zero_copy_write_refusal(PagedKV(self.source, geometry.layer_block_bytes))
        # The writer's own rule (cio.writer): straight from the slots, or gathered.
        self.write_path = f"gather ({refusal})" if refusal else "zero-copy"

    def write_turns(self) -> tuple[int, float]:
        """Store every turn; returns (bytes written, wall seconds of all turns)."""
        tpb = self.geometry.tokens_per_block
        ids = torch.arange(self.num_blocks, dtype=torch.int64)
        written = 0
        t0 = time.perf_counter()
        for turn, blocks in enumerate(self.turns):
            res = self.store.store_turn(
                SESSION_ID, self.keys[:blocks.stop], self.source, ids[:blocks.stop],
                TurnSignals(turn_index=turn, context_tokens=blocks.stop * tpb))
            if res.medium != Medium.SSD or res.num_blocks != len(blocks):
                raise RuntimeError(f"turn {turn} stored {res.num_blocks} blocks on "
                                   f"{res.medium}, expected {len(blocks)} on SSD")
            written += res.bytes_written
        return written, time.perf_counter() - t0

    def restore(self, dest: Sequence[torch.Tensor], table: torch.Tensor) -> ProgramRun:
        """``store.load`` of the whole session into ``dest`` at slots ``table``."""
        before = self.store.reader.stats()
        t0 = time.perf_counter()
        res = self.store.load(self.keys, dest, table)
        seconds = time.perf_counter() - t0
        after = self.store.reader.stats()
        if res.num_blocks != self.num_blocks:
            raise RuntimeError(f"flatcake restored {res.num_blocks} of {self.num_blocks} "
                               f"blocks ({res.damaged_segments} damaged segments)")
        self.read_paths.add(res.read_path if not res.staging_reason else
                            f"{res.read_path} ({res.staging_reason})")
        return ProgramRun(seconds, after.commands - before.commands,
                          after.bytes_read - before.bytes_read)

    def lookup_and_plan_ms(self, repeats: int = 5) -> float:
        """Median ``prepare_load`` (index lookup + read plan) of the whole session."""
        ms, _ = time_prepare_load(self.store.control, self.keys, repeats=repeats)
        return ms

    def staging_bytes(self) -> int:
        """One staging slot: the largest layer of the restore's read plan."""
        plan = self.store.control.prepare_load("bench-staging", self.keys,
                                               planner=plan_reads)
        self.store.control.complete_load("bench-staging")
        return max((sum(op.length for op in lp.ssd_ops) for lp in plan.read_plan.layers),
                   default=0)

    def close(self) -> None:
        self.store.close()
