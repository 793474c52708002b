"""Which blocks of a baseline's store hold their sliding-window pages, for the baselines
that follow SGLang 0.5.23's window rule (``layers.PeerBlocks``, rule ``sglang``).

SGLang keeps the pages of a sliding-window pool, and DeepSeek-V4's compressor-state
pools, for one trailing window per request, not for every page
(sgl-project/sglang 0.5.23, ``python/sglang/srt/mem_cache/``):

* the device frees a request's sliding pages once they leave its window
  (``unified_cache/components/swa.py``: ``_free_out_of_window_slots``), so the host
  backup and the storage backup hold the window's trailing pages only
  (``build_hicache_transfers``, ``BACKUP_STORAGE``: ``host_value[-num_pages *
  page_size:]`` under ``node.hash_value[-num_pages:]``, ``PoolHitPolicy.TRAILING_PAGES``);
* DeepSeek-V4's c4, c4-indexer and c128 state pools take their indices from the
  sliding pool (``hybrid_cache/hybrid_pool_assembler.py``: ``indices_from_pool=
  PoolName.SWA``, ``TRAILING_PAGES``), so they follow the same rule;
* a storage hit is cut back to the longest prefix whose trailing window exists
  (``storage/mooncake_store/mooncake_store.py``, ``batch_exists_v2``: "A stop point
  works when the window ending there is complete"); a host hit likewise
  (``swa.py``, ``create_match_validator``: every page within the window of the match's
  end has a device or host value);
* a load reads the window's pages at the hit's end
  (``hybrid_cache/hybrid_cache_controller.py``, ``_sync_trailing_keys``:
  ``all_hashes[max(0, kv_hit_pages - trailing_n):kv_hit_pages]``).

A block id stands for one page of one prefix (the replay's ids are prefix-chained), so
"the store holds the window pages of block b" is one flag per id, set for the last
``window_blocks`` blocks of each finished request and cleared when the block leaves the
store. The window pages of a block ride in its object and host slot: they are written,
demoted and recycled with it.
"""

from __future__ import annotations

import numpy as np

from flatcake.replay.workload.runs import Runs, slice_runs
from flatcake.replay.workload.types import IdArray


class TrailingWindows:
    """Per block id, whether the store holds its window pages; ``window_blocks`` = 0
    (no window the engine prefix-caches) makes every method a no-op."""

    __slots__ = ("cut_blocks", "cuts", "held", "num_held", "window_blocks")

    def __init__(self, num_ids: int, window_blocks: int) -> None:
        self.window_blocks = window_blocks
        self.held = np.zeros(num_ids if window_blocks else 0, dtype=bool)
        self.num_held = 0  # blocks holding their window pages
        self.cuts = 0  # hits cut back (``cut(record=True)``) ...
        self.cut_blocks = 0  # ... and the blocks they lost

    def mark(self, runs: Runs, full_blocks: int) -> None:
        """A request finished over ``runs`` whose first ``full_blocks`` blocks are full
        (a trace's partial last block is not a page SGLang's tree caches): the last
        ``window_blocks`` full blocks keep their window pages."""
        w = self.window_blocks
        if not w or not runs:
            return
        n = min(sum(e - s for s, e in runs), full_blocks)
        for s, e in slice_runs(runs, max(0, n - w), n):
            self.num_held += e - s - int(np.count_nonzero(self.held[s:e]))
            self.held[s:e] = True

    def drop(self, ids: IdArray) -> None:
        """Blocks that left the store: their window pages went with them."""
        if self.window_blocks and len(ids):
            self.num_held -= int(np.count_nonzero(self.held[ids]))
            self.held[ids] = False

    def held_in(self, resident: np.ndarray) -> int:
        """How many blocks holding their window pages ``resident`` (a mask over every
        id) marks: the window pages a tier holds beside those blocks."""
        if not self.num_held:
            return 0
        return int(np.count_nonzero(self.held & resident))

    def count(self, ids: IdArray) -> int:
        """How many of ``ids`` hold their window pages."""
        if not self.window_blocks or not len(ids):
            return 0
        return int(np.count_nonzero(self.held[ids]))

    def count_runs(self, runs: Runs) -> int:
        """How many blocks of ``runs`` hold their window pages."""
        if not self.window_blocks:
            return 0
        return sum(int(np.count_nonzero(self.held[s:e])) for s, e in runs)

    def cut(self, runs: Runs, start: int, end: int, record: bool = False) -> int:
        """The longest hit end in ``[start, end]`` whose trailing window is held: every
        block of ``[max(start, p - window_blocks), p)`` (blocks before ``start`` are on
        the GPU already). ``start`` when none is; ``end`` without a window. ``record``:
        count the cut (once per request: where its hit is decided)."""
        w = self.window_blocks
        if not w or end <= start:
            return end
        got = self._cut(runs, start, end, w)
        if record and got < end:
            self.cuts += 1
            self.cut_blocks += end - got
        return got

    def metrics(self) -> dict[str, int]:
        return {"window_cut_hits": self.cuts, "window_cut_blocks": self.cut_blocks} \
            if self.window_blocks else {}

    def _cut(self, runs: Runs, start: int, end: int, w: int) -> int:
        parts = slice_runs(runs, start, end)
        flags = np.concatenate([self.held[s:e] for s, e in parts]) if len(parts) > 1 \
            else self.held[parts[0][0]:parts[0][1]]
        n = len(flags)
        if flags[n - min(w, n):].all():
            return end
        # Consecutive held blocks ending at each position: a stop point p works when
        # they reach back min(w, p) blocks.
        idx = np.arange(1, n + 1)
        last_gap = np.maximum.accumulate(np.where(flags, 0, idx))
        run = idx - last_gap
        ok = np.flatnonzero(run >= np.minimum(w, idx))
        return start + int(ok[-1]) + 1 if len(ok) else start
