"""An LRU set of KV blocks over dense block ids, in bulk numpy operations.

Used for the models of caches that really are LRU: each engine's GPU prefix cache, and
the host-memory tier of the tiered and memory-only baselines. FlatCake's own store does
not use it (its placement and reclaim are the control plane's).

Representation (no per-block Python objects):

* ``tick[id]``: 0 when the block is absent, else the tick of its last touch;
* ``pins[id]``: how many running requests hold the block (pinned blocks never leave);
* a queue of touch events ``(tick, ids in eviction order)``, oldest first. A touch puts
  a whole request's blocks at the same tick, leaf first (a request's last block is
  evicted before its first, the order of a radix tree's leaf-first LRU). Eviction pops
  events from the oldest and keeps only entries whose tick still matches (later touches
  made the old entry stale), so a block's place is found in amortised O(1).

Invariant: every present, unpinned block has a queued event carrying its current tick.
``unpin`` therefore re-touches, and a pinned block skipped by eviction is re-queued by
that touch. Block ids inside one touch must be distinct (true of chained prefix hashes).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from flatcake.replay.types import IdArray

_EMPTY = np.zeros(0, dtype=np.int32)


class BlockLru:
    """LRU set of up to ``capacity_blocks`` blocks out of ids ``[0, num_ids)``.

    The cache never evicts on its own: callers ask ``free_blocks()`` and call ``evict``
    (the caller decides what eviction means: drop, demote to SSD, ...). Owned by the
    simulator's single thread.
    """

    __slots__ = ("_events", "_queued", "_tick", "capacity_blocks", "name", "pins", "size",
                 "tick")

    def __init__(self, num_ids: int, capacity_blocks: int, name: str = "lru") -> None:
        if num_ids < 0:
            raise ValueError(f"BlockLru.num_ids must be >= 0, got {num_ids}")
        if capacity_blocks < 0:
            raise ValueError(f"BlockLru.capacity_blocks must be >= 0, got {capacity_blocks}")
        self.name = name
        self.capacity_blocks = int(capacity_blocks)
        self.tick = np.zeros(num_ids, dtype=np.int32)
        self.pins = np.zeros(num_ids, dtype=np.int16)
        self.size = 0
        self._events: deque[tuple[int, IdArray]] = deque()
        self._queued = 0
        self._tick = 0

    # ---- queries -----------------------------------------------------------------
    def free_blocks(self) -> int:
        return self.capacity_blocks - self.size

    def present(self, ids: IdArray) -> np.ndarray:
        return self.tick[ids] != 0

    def count_present(self, ids: IdArray) -> int:
        return int(np.count_nonzero(self.tick[ids]))

    def prefix_hits(self, ids: IdArray, start: int = 0) -> int:
        """Length of the run of present blocks in ``ids`` beginning at ``start``."""
        if start >= len(ids):
            return 0
        p = self.tick[ids[start:]] != 0
        if p.all():
            return len(p)
        return int(p.argmin())

    # ---- updates -----------------------------------------------------------------
    def touch(self, ids: IdArray) -> int:
        """Insert or refresh ``ids`` (most recent now); returns how many were new.

        May leave the cache above capacity; the caller evicts.
        """
        if len(ids) == 0:
            return 0
        self._tick += 1
        t = self._tick
        cur = self.tick[ids]
        new = len(ids) - int(np.count_nonzero(cur))
        self.size += new
        self.tick[ids] = t
        self._events.append((t, ids[::-1]))
        self._queued += len(ids)
        if self._queued > 4 * self.capacity_blocks + 65536:
            self._compact()
        return new

    def pin(self, ids: IdArray) -> None:
        """Hold ``ids`` (which must be present) against eviction."""
        self.pins[ids] += 1

    def unpin(self, ids: IdArray) -> None:
        """Release a hold taken by ``pin`` and refresh the blocks' recency."""
        self.pins[ids] -= 1
        self.touch(ids)

    def remove(self, ids: IdArray) -> int:
        """Drop whichever of ``ids`` are present (pinned or not); returns the count."""
        cur = self.tick[ids]
        gone = int(np.count_nonzero(cur))
        if gone:
            self.tick[ids] = 0
            self.size -= gone
        return gone

    def evict(self, num_blocks: int) -> IdArray:
        """Remove up to ``num_blocks`` unpinned blocks, least recent first; returns
        them in eviction order (fewer if everything else is pinned)."""
        need = int(num_blocks)
        if need <= 0:
            return _EMPTY
        out: list[IdArray] = []
        events = self._events
        tick = self.tick
        pins = self.pins
        while need > 0 and events:
            t, ids = events[0]
            alive = ids[(tick[ids] == t) & (pins[ids] == 0)]
            if len(alive) <= need:
                events.popleft()
                self._queued -= len(ids)
                take = alive
            else:
                take = alive[:need]
                rest = alive[need:]
                events[0] = (t, rest)
                self._queued -= len(ids) - len(rest)
            if len(take):
                tick[take] = 0
                self.size -= len(take)
                need -= len(take)
                out.append(take)
        if not out:
            return _EMPTY
        return out[0] if len(out) == 1 else np.concatenate(out)

    def _compact(self) -> None:
        """Drop stale entries from the event queue (bounded memory)."""
        tick = self.tick
        kept: deque[tuple[int, IdArray]] = deque()
        queued = 0
        for t, ids in self._events:
            alive = ids[tick[ids] == t]
            if len(alive):
                kept.append((t, alive))
                queued += len(alive)
        self._events = kept
        self._queued = queued

    def check(self) -> None:
        """Integrity check for tests: counts agree with the arrays."""
        present = int(np.count_nonzero(self.tick))
        if present != self.size:
            raise AssertionError(f"{self.name}: size {self.size} != present {present}")
        if (self.pins < 0).any():
            raise AssertionError(f"{self.name}: negative pin count")
