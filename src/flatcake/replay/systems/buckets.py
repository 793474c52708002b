"""The tiered baselines' SSD tier: Mooncake Store's ``BucketStorageBackend`` as they use
it (``tiered.py`` says where each behaviour comes from).

Blocks evicted from host memory without an SSD copy are written, in eviction order, into
the open bucket; a bucket is sealed at ``TieredConfig.bucket_keys`` objects or
``bucket_bytes``; when the SSD budget is full the oldest sealed bucket is deleted whole
(FIFO), and its blocks that are not in host memory are lost, their window pages with
them (``windows.TrailingWindows``).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from flatcake.replay.node.node import Node
from flatcake.replay.systems.settings import TieredConfig
from flatcake.replay.systems.windows import TrailingWindows
from flatcake.replay.workload.types import IdArray


class SsdBuckets:
    """Which bucket holds each block id (``bucket_of``, -1: not on SSD), the sealed
    buckets oldest first and the open one. ``obj_bytes``: one block's object;
    ``win_obj_bytes``: the object of a block's window pages, written beside it where
    ``wins`` says the block holds them; ``host_tick``: the host tier's presence array
    (a recycled block still in host memory is not lost)."""

    def __init__(self, cfg: TieredConfig, num_ids: int, obj_bytes: int,
                 win_obj_bytes: int = 0, wins: TrailingWindows | None = None,
                 host_tick: np.ndarray | None = None) -> None:
        self.cfg = cfg
        self.obj_bytes = obj_bytes
        self.win_obj_bytes = win_obj_bytes
        self.wins = wins if wins is not None else TrailingWindows(0, 0)
        self.host_tick = host_tick if host_tick is not None else np.zeros(num_ids, np.int32)
        self.bucket_of = np.full(num_ids, -1, dtype=np.int32)
        self.buckets: deque[tuple[int, IdArray, int]] = deque()  # sealed, oldest first
        self.open_ids: list[IdArray] = []
        self.open_count = 0
        self.open_bytes = 0
        self.next_bucket = 0
        self.used_bytes = 0
        self.num_recycled = 0
        self.blocks_lost = 0
        self.blocks_demoted = 0

    def demote(self, node: Node, evicted: IdArray) -> None:
        """Write the blocks of ``evicted`` that have no SSD copy, in order."""
        if not len(evicted):
            return
        ssd_cap = node.spec.ssd.capacity_bytes
        if ssd_cap <= 0:
            return
        todo = evicted[self.bucket_of[evicted] < 0]
        if not len(todo):
            return
        self.blocks_demoted += len(todo)
        per_bucket = max(1, min(self.cfg.bucket_keys, self.cfg.bucket_bytes // self.obj_bytes))
        pos = 0
        while pos < len(todo):
            room = per_bucket - self.open_count
            take = todo[pos:pos + room]
            pos += len(take)
            nbytes = len(take) * self.obj_bytes + self.wins.count(take) * self.win_obj_bytes
            # FIFO recycling: drop the oldest sealed buckets until the write fits.
            while self.used_bytes + nbytes > ssd_cap and self.buckets:
                self._recycle_oldest()
            if self.used_bytes + nbytes > ssd_cap:
                return  # the budget is smaller than one bucket: nothing more fits
            self.bucket_of[take] = self.next_bucket
            self.open_ids.append(take)
            self.open_count += len(take)
            self.open_bytes += nbytes
            self.used_bytes += nbytes
            w = node.workers[self.next_bucket % len(node.workers)]
            t = node.spec.ssd.write_time_s(1, nbytes)
            w.ssd.submit(node.now, t, nbytes, 1)
            node.rec.ssd_write(1, nbytes)
            if self.open_count >= per_bucket:
                self._seal()

    def _seal(self) -> None:
        ids = np.concatenate(self.open_ids) if len(self.open_ids) > 1 else self.open_ids[0]
        self.buckets.append((self.next_bucket, ids, self.open_bytes))
        self.next_bucket += 1
        self.open_ids = []
        self.open_count = 0
        self.open_bytes = 0

    def _recycle_oldest(self) -> None:
        bucket, ids, nbytes = self.buckets.popleft()
        live = ids[self.bucket_of[ids] == bucket]
        self.bucket_of[live] = -1
        self.used_bytes -= nbytes
        self.num_recycled += 1
        gone = live[self.host_tick[live] == 0]
        self.blocks_lost += len(gone)
        self.wins.drop(gone)

    def metrics(self) -> dict[str, Any]:
        return {
            "buckets_recycled": self.num_recycled,
            "blocks_lost_to_recycling": self.blocks_lost,
            "blocks_demoted": self.blocks_demoted,
            "ssd_used_bytes": self.used_bytes,
        }
