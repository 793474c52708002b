"""FC-MAS: memory-aware restore scheduling: the request as it sees it, the priority
formula, the ready queue and the scheduler. Pure queue logic on a ``Clock``; no I/O.

Two-queue mode (the design)::

    submit ──┬─ all hit blocks in memory ──────────────────────────► ready queue
             │                                                      (by arrival time)
             └─ any block on SSD ─► SSD-preparing queue ─► in flight ─┘ restore_done
                                    (priority order)     (<= max_restores_in_flight)

- ``next_restores()`` starts restores while fewer than ``max_restores_in_flight`` are in
  flight, highest ``priority = 1 + wait_time / kv_bytes`` first (ties: earlier arrival,
  then submission order). A restore that finds every slot busy *waits* in the queue;
  nothing is ever cancelled. Small restores go first; a large one's priority keeps
  rising while it waits, so it is never starved.
- ``restore_done()`` puts the request into the ready queue at its original arrival
  position, ahead of requests that arrived after it.

Single-queue mode (``SchedulerConfig.single_queue``, the paper's ablation): one FIFO
in submission order. ``pop_ready()`` only ever returns the head, and only once the head
is ready (memory-only, or its restore is done), so a memory-only request waits behind
every SSD restore submitted before it. Restores start in FIFO order (not by priority),
with the same ``max_restores_in_flight`` bound, so the ablation changes only the queue
discipline, not the I/O parallelism.

Single-threaded: the owner (engine scheduler or simulator event loop) serialises calls.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from flatcake.clock import Clock, WallClock
from flatcake.config import GIB, SchedulerConfig
from flatcake.errors import IntegrityError

PRIORITY_UNIT_BYTES = GIB
"""KV size unit of the priority formula. Only the printed priority depends on it (the
paper quotes sizes in GB: 1 GB waiting 2 s -> 3); the order is the same for any unit."""


@dataclass(frozen=True, slots=True)
class RestoreRequest:
    """A request as the scheduler sees it.

    Attributes:
        request_id: unique among the requests the scheduler holds.
        arrival_time: clock time the request arrived (its place in the ready queue).
        kv_bytes: KV bytes its restore reads from SSD (the priority's denominator).
        needs_ssd: any of its hit blocks lives on SSD (then ``kv_bytes > 0``).
    """

    request_id: Hashable
    arrival_time: float
    kv_bytes: int
    needs_ssd: bool

    def __post_init__(self) -> None:
        if not isinstance(self.arrival_time, int | float) or not math.isfinite(
                self.arrival_time):
            raise ValueError(f"RestoreRequest.arrival_time must be a finite number, got "
                             f"{self.arrival_time!r}")
        if not isinstance(self.kv_bytes, int) or self.kv_bytes < 0:
            raise ValueError(f"RestoreRequest.kv_bytes must be an int >= 0, got "
                             f"{self.kv_bytes!r}")
        if not isinstance(self.needs_ssd, bool):
            raise ValueError(f"RestoreRequest.needs_ssd must be a bool, got "
                             f"{self.needs_ssd!r}")
        if self.needs_ssd and self.kv_bytes == 0:
            raise ValueError(f"RestoreRequest.kv_bytes must be > 0 when needs_ssd, request "
                             f"{self.request_id!r}")


def priority(wait_s: float, kv_bytes: int, unit_bytes: int = PRIORITY_UNIT_BYTES) -> float:
    """``1 + wait_time / kv_size`` with the size in ``unit_bytes`` units."""
    if kv_bytes <= 0:
        raise ValueError(f"kv_bytes must be > 0, got {kv_bytes!r}")
    return 1.0 + max(wait_s, 0.0) / (kv_bytes / unit_bytes)


class ReadyQueue:
    """Requests ready to run, ordered by original arrival time (ties: submission order).

    A restored request re-enters at its arrival position, ahead of every request that
    arrived after it, because its time in the SSD queue counts too.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, RestoreRequest]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, req: RestoreRequest, seq: int) -> None:
        heapq.heappush(self._heap, (req.arrival_time, seq, req))

    def pop(self) -> RestoreRequest | None:
        return heapq.heappop(self._heap)[2] if self._heap else None

    def peek(self) -> RestoreRequest | None:
        return self._heap[0][2] if self._heap else None

    def items(self) -> list[RestoreRequest]:
        """All ready requests in arrival order (does not pop)."""
        return [e[2] for e in sorted(self._heap)]

    def ids(self) -> set[Hashable]:
        return {e[2].request_id for e in self._heap}


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """Counters since construction.

    Attributes:
        num_submitted: requests submitted.
        num_memory_only: requests that needed no SSD restore.
        num_restores_started: restores handed out by ``next_restores``.
        num_restores_done: restores reported by ``restore_done``.
        num_slot_waits: SSD requests that found every restore slot busy at least once.
        total_slot_wait_s: summed time from submission to restore start.
        max_in_flight: most restores in flight at once.
    """

    num_submitted: int
    num_memory_only: int
    num_restores_started: int
    num_restores_done: int
    num_slot_waits: int
    total_slot_wait_s: float
    max_in_flight: int


@dataclass(slots=True)
class _Entry:
    req: RestoreRequest
    seq: int
    submit_time: float
    restored: bool = False  # single-queue mode: restore finished


def _priority_key(req: RestoreRequest, now: float, seq: int) -> tuple[float, float, int]:
    """Highest wait/kv first, then earliest arrival, then submission order. Comparing
    wait/kv is the same as comparing 1 + wait/kv in any size unit."""
    return (-max(now - req.arrival_time, 0.0) / req.kv_bytes, req.arrival_time, seq)


class MasScheduler:
    """The FC-MAS scheduler (see the module docstring for both modes)."""

    def __init__(self, cfg: SchedulerConfig | None = None, clock: Clock | None = None) -> None:
        self.cfg = cfg if cfg is not None else SchedulerConfig()
        self.clock: Clock = clock if clock is not None else WallClock()
        self._seq = 0
        self._entries: dict[Hashable, _Entry] = {}  # every request held
        self._ready = ReadyQueue()  # two-queue mode
        self._waiting: dict[Hashable, _Entry] = {}  # two-queue: SSD queue, not started
        self._in_flight: dict[Hashable, float] = {}  # request id -> start time
        self._fifo: deque[_Entry] = deque()  # single-queue mode
        self._slot_waited: set[Hashable] = set()
        self._num_memory_only = 0
        self._num_started = 0
        self._num_done = 0
        self._num_slot_waits = 0
        self._slot_wait_s = 0.0
        self._max_in_flight = 0

    # -- queries ---------------------------------------------------------------------

    def __len__(self) -> int:
        """Requests held (ready, preparing or in flight)."""
        return len(self._entries)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._entries

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    def in_flight(self) -> list[RestoreRequest]:
        """Restores in flight, in start order."""
        return [self._entries[r].req for r in self._in_flight]

    def priority(self, req: RestoreRequest) -> float:
        """``1 + wait / kv_size`` now (``PRIORITY_UNIT_BYTES`` units)."""
        return priority(self.clock.now() - req.arrival_time, req.kv_bytes)

    def preparing_requests(self) -> list[RestoreRequest]:
        """SSD requests waiting for a restore slot, in the order they would start now."""
        if self.cfg.single_queue:
            return [e.req for e in self._fifo
                    if e.req.needs_ssd and not e.restored and e.req.request_id
                    not in self._in_flight]
        return [e.req for e in self._by_priority(list(self._waiting.values()))]

    def ready_requests(self) -> list[RestoreRequest]:
        """What ``pop_ready`` would return, in order, without popping."""
        if not self.cfg.single_queue:
            return self._ready.items()
        out = []
        for e in self._fifo:
            if not self._is_ready(e):
                break
            out.append(e.req)
        return out

    @property
    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_submitted=self._seq,
            num_memory_only=self._num_memory_only,
            num_restores_started=self._num_started,
            num_restores_done=self._num_done,
            num_slot_waits=self._num_slot_waits,
            total_slot_wait_s=self._slot_wait_s,
            max_in_flight=self._max_in_flight,
        )

    # -- verbs -----------------------------------------------------------------------

    def submit(self, req: RestoreRequest) -> None:
        """Queue a request: ready at once if it needs no SSD, else SSD-preparing."""
        if not isinstance(req, RestoreRequest):
            raise ValueError(f"submit expects a RestoreRequest, got {type(req).__name__}")
        if req.request_id in self._entries:
            raise ValueError(f"request_id {req.request_id!r} is already queued")
        entry = _Entry(req, self._seq, self.clock.now())
        self._seq += 1
        self._entries[req.request_id] = entry
        if not req.needs_ssd:
            self._num_memory_only += 1
        if self.cfg.single_queue:
            self._fifo.append(entry)
        elif req.needs_ssd:
            self._waiting[req.request_id] = entry
        else:
            self._ready.push(req, entry.seq)

    def next_restores(self) -> list[RestoreRequest]:
        """Restores to start now (possibly none); each must later be reported with
        ``restore_done``. Requests that do not get a slot keep waiting."""
        free = self.cfg.max_restores_in_flight - len(self._in_flight)
        if self.cfg.single_queue:
            candidates = [e for e in self._fifo
                          if e.req.needs_ssd and not e.restored
                          and e.req.request_id not in self._in_flight]
        else:
            candidates = self._by_priority(list(self._waiting.values()))
        started = candidates[:max(free, 0)]
        now = self.clock.now()
        for e in candidates[len(started):]:
            if e.req.request_id not in self._slot_waited:
                self._slot_waited.add(e.req.request_id)
                self._num_slot_waits += 1
        for e in started:
            rid = e.req.request_id
            self._waiting.pop(rid, None)
            self._slot_waited.discard(rid)
            self._in_flight[rid] = now
            self._slot_wait_s += now - e.submit_time
        self._num_started += len(started)
        self._max_in_flight = max(self._max_in_flight, len(self._in_flight))
        return [e.req for e in started]

    def restore_done(self, request_id: Hashable) -> None:
        """A restore finished: the request becomes ready at its arrival position."""
        if request_id not in self._in_flight:
            raise KeyError(f"request_id {request_id!r} has no restore in flight")
        del self._in_flight[request_id]
        self._num_done += 1
        entry = self._entries[request_id]
        if self.cfg.single_queue:
            entry.restored = True
        else:
            self._ready.push(entry.req, entry.seq)

    def pop_ready(self) -> RestoreRequest | None:
        """The next request to run, or ``None`` when none is ready (in single-queue mode:
        when the head is not ready, even if requests behind it are)."""
        if self.cfg.single_queue:
            if not self._fifo or not self._is_ready(self._fifo[0]):
                return None
            req = self._fifo.popleft().req
        else:
            popped = self._ready.pop()
            if popped is None:
                return None
            req = popped
        del self._entries[req.request_id]
        return req

    # -- internals -------------------------------------------------------------------

    def _is_ready(self, e: _Entry) -> bool:
        return not e.req.needs_ssd or e.restored

    def _by_priority(self, entries: list[_Entry]) -> list[_Entry]:
        now = self.clock.now()
        return sorted(entries, key=lambda e: _priority_key(e.req, now, e.seq))

    def order(self, reqs: Sequence[RestoreRequest]) -> list[RestoreRequest]:
        """The order this queue would run ``reqs`` (not held by it) if they were
        submitted now in the given order: two-queue, the all-memory ones first, then
        the SSD ones highest priority first; single-queue, as given (FIFO). For restores
        that all run at once (a CPU engine's loads in the step), in this order."""
        if self.cfg.single_queue:
            return list(reqs)
        now = self.clock.now()
        memory = [r for r in reqs if not r.needs_ssd]
        ssd = [(r, i) for i, r in enumerate(reqs) if r.needs_ssd]
        return memory + [r for r, _ in sorted(ssd, key=lambda x: _priority_key(x[0], now,
                                                                               x[1]))]

    def check_integrity(self) -> None:
        """Every held request is in exactly one place; the in-flight bound holds."""
        if len(self._in_flight) > self.cfg.max_restores_in_flight:
            raise IntegrityError(f"{len(self._in_flight)} restores in flight > "
                                 f"max_restores_in_flight={self.cfg.max_restores_in_flight}")
        if self.cfg.single_queue:
            ids = [e.req.request_id for e in self._fifo]
            if len(set(ids)) != len(ids) or set(ids) != set(self._entries):
                raise IntegrityError("FIFO and request table disagree")
            for rid in self._in_flight:
                e = self._entries.get(rid)
                if e is None or e.restored or not e.req.needs_ssd:
                    raise IntegrityError(f"bad in-flight request {rid!r}")
            return
        ready = self._ready.ids()
        waiting = set(self._waiting)
        flying = set(self._in_flight)
        if len(ready) != len(self._ready):
            raise IntegrityError("a request is twice in the ready queue")
        if ready & waiting or ready & flying or waiting & flying:
            raise IntegrityError("a request is in two queues at once")
        if ready | waiting | flying != set(self._entries):
            raise IntegrityError("queues and request table disagree")
        if any(not self._entries[r].req.needs_ssd for r in waiting | flying):
            raise IntegrityError("a memory-only request is in the SSD queue")


__all__ = ["MasScheduler", "RestoreRequest", "SchedulerStats"]
