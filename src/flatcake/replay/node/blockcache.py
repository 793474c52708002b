"""An LRU set of KV blocks over dense block ids, worked on by runs of ids.

Used for the caches that really are LRU: each engine's GPU prefix cache, and the host
tier of the tiered and memory-only baselines. FlatCake's own store does not use it (its
placement and reclaim are the control plane's).

Representation (no per-block Python objects):

* ``tick[id]``: 0 when the block is absent, else the tick of its last touch;
* ``pins[id]``: how many running requests hold the block (pinned blocks never leave);
* a queue of touch events ``(tick, runs)``, oldest first. A touch puts a whole
  request's blocks at one tick; eviction takes an event's blocks leaf first (its last
  block first, the order of a radix tree's leaf-first LRU), and only entries whose tick
  still matches (a later touch made the old entry stale), so a block's place is found
  in amortised O(1).

Every per-block operation is a slice over a run (``tick[s:e]``), so a request costs a
few numpy calls whatever its length.

Invariant: every present, unpinned block has a queued event carrying its current tick.
``unpin`` therefore re-touches, and a pinned block skipped by eviction is re-queued by
that touch. Runs passed to one touch must not overlap (true of chained prefix ids).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from flatcake.replay.workload.runs import Runs
from flatcake.replay.workload.types import IdArray

_EMPTY = np.zeros(0, dtype=np.int32)
# ``count_nonzero`` is the cheapest whole-slice test numpy has (no temporary array, no
# Python-level wrapper as ``ndarray.all``/``any`` have): the caches use it per run.
count_nonzero = np.count_nonzero


class BlockLru:
    """LRU set of up to ``capacity_blocks`` blocks out of ids ``[0, num_ids)``.

    The cache never evicts on its own: callers check ``free_blocks()`` and call
    ``evict`` (the caller decides what eviction means: drop, demote to SSD, ...). Owned
    by the simulator's single thread.
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
        self._events: deque[tuple[int, Runs]] = deque()
        self._queued = 0
        self._tick = 0

    # ---- queries -----------------------------------------------------------------
    def free_blocks(self) -> int:
        return self.capacity_blocks - self.size

    def count_present(self, runs: Runs) -> int:
        tick = self.tick
        return sum(int(np.count_nonzero(tick[s:e])) for s, e in runs)

    def presence(self, runs: Runs) -> tuple[int, int]:
        """``(count_present(runs), prefix_hits(runs))`` in one pass."""
        tick = self.tick
        present = 0
        prefix = 0
        in_prefix = True
        for s, e in runs:
            seg = tick[s:e]
            nz = int(np.count_nonzero(seg))
            present += nz
            if in_prefix:
                if nz == e - s:
                    prefix += nz
                else:
                    prefix += int(np.argmin(seg != 0))
                    in_prefix = False
        return present, prefix

    def prefix_hits(self, runs: Runs, start: int = 0) -> int:
        """Length of the run of present blocks beginning at position ``start``."""
        tick = self.tick
        skip = start
        total = 0
        for s, e in runs:
            n = e - s
            if skip >= n:
                skip -= n
                continue
            a = s + skip
            skip = 0
            seg = tick[a:e]
            if count_nonzero(seg) == e - a:
                total += e - a
                continue
            return total + int(np.argmin(seg != 0))
        return total

    # ---- updates -----------------------------------------------------------------
    def touch(self, runs: Runs) -> int:
        """Insert or refresh ``runs`` (most recent now); returns how many were new.

        May leave the cache above capacity; the caller evicts.
        """
        if not runs:
            return 0
        self._tick += 1
        t = self._tick
        tick = self.tick
        new = 0
        n = 0
        for s, e in runs:
            new += (e - s) - int(np.count_nonzero(tick[s:e]))
            tick[s:e] = t
            n += e - s
        self.size += new
        self._events.append((t, runs))
        self._queued += n
        if self._queued > 4 * self.capacity_blocks + 65536:
            self._compact()
        return new

    def touch_pin(self, runs: Runs) -> int:
        """``touch`` then ``pin`` in one pass; returns how many were new."""
        if not runs:
            return 0
        self._tick += 1
        t = self._tick
        tick = self.tick
        pins = self.pins
        new = 0
        n = 0
        for s, e in runs:
            new += (e - s) - int(np.count_nonzero(tick[s:e]))
            tick[s:e] = t
            pins[s:e] += 1
            n += e - s
        self.size += new
        self._events.append((t, runs))
        self._queued += n
        if self._queued > 4 * self.capacity_blocks + 65536:
            self._compact()
        return new

    def pin(self, runs: Runs) -> None:
        """Hold ``runs`` (which must be present) against eviction."""
        pins = self.pins
        for s, e in runs:
            pins[s:e] += 1

    def unpin(self, runs: Runs) -> None:
        """Release a hold taken by ``pin`` and refresh the blocks' recency."""
        pins = self.pins
        for s, e in runs:
            pins[s:e] -= 1
        self.touch(runs)

    def remove(self, runs: Runs) -> int:
        """Drop whichever of ``runs`` are present (pinned or not); returns the count."""
        tick = self.tick
        gone = 0
        for s, e in runs:
            gone += int(np.count_nonzero(tick[s:e]))
            tick[s:e] = 0
        self.size -= gone
        return gone

    def evict(self, num_blocks: int) -> IdArray:
        """Remove up to ``num_blocks`` unpinned blocks, least recent first (leaf first
        inside one touch); returns them in eviction order (fewer when everything else
        is pinned)."""
        out: list[IdArray] = []
        self._evict(num_blocks, out)
        if not out:
            return _EMPTY
        return out[0] if len(out) == 1 else np.concatenate(out)

    def drop(self, num_blocks: int) -> int:
        """Like ``evict`` when the caller does not need the ids; returns the count."""
        return self._evict(num_blocks, None)

    def _evict(self, num_blocks: int, out: list[IdArray] | None) -> int:
        need = int(num_blocks)
        if need <= 0:
            return 0
        done = 0
        events = self._events
        tick = self.tick
        pins = self.pins
        while need > 0 and events:
            t, runs = events[0]
            k = len(runs)
            while k > 0 and need > 0:
                s, e = runs[k - 1]
                live = tick[s:e] == t
                num_live = count_nonzero(live)
                if not num_live:
                    # Stale: every block was touched again (or left) since.
                    self._queued -= e - s
                    k -= 1
                    continue
                if count_nonzero(pins[s:e]):
                    live &= pins[s:e] == 0
                    num_live = count_nonzero(live)
                if e - s <= need and num_live == e - s:
                    # The whole run leaves: slices, no index arrays.
                    tick[s:e] = 0
                    self._queued -= e - s
                    need -= e - s
                    done += e - s
                    if out is not None:
                        out.append(np.arange(e - 1, s - 1, -1, dtype=np.int32))
                    k -= 1
                    continue
                cand = np.flatnonzero(live)
                if len(cand) <= need:
                    take = cand[::-1] + s
                    k -= 1
                    self._queued -= e - s
                else:
                    take = cand[len(cand) - need:][::-1] + s
                    cut = int(cand[len(cand) - need]) + s
                    self._queued -= e - cut
                    runs = (*runs[:k - 1], (s, cut))
                if len(take):
                    tick[take] = 0
                    need -= len(take)
                    done += len(take)
                    if out is not None:
                        out.append(take.astype(np.int32, copy=False))
            if k == 0:
                events.popleft()
            else:
                events[0] = (t, runs[:k])
        self.size -= done
        return done

    def _compact(self) -> None:
        """Drop fully stale events from the queue (bounded memory and work)."""
        tick = self.tick
        kept: deque[tuple[int, Runs]] = deque()
        queued = 0
        for t, runs in self._events:
            live = tuple((s, e) for s, e in runs if (tick[s:e] == t).any())
            if live:
                kept.append((t, live))
                queued += sum(e - s for s, e in live)
        self._events = kept
        self._queued = queued

    def check(self) -> None:
        """Integrity check for tests: counts agree with the arrays."""
        present = int(np.count_nonzero(self.tick))
        if present != self.size:
            raise AssertionError(f"{self.name}: size {self.size} != present {present}")
        if (self.pins < 0).any():
            raise AssertionError(f"{self.name}: negative pin count")
