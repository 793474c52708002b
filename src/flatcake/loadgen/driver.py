"""The driver: sends a workload's turns at a rate or a concurrency and collects replies.

Two pacings, both keeping each session's turns in order (a turn is sent after its
previous turn's reply):

- ``concurrency C`` (closed loop): C workers, each sending its next turn as soon as its
  last reply is in; a worker picks the turn of a session waiting the longest, else
  starts the next session.
- ``rate R`` (open loop): turns become due at Poisson arrivals of R per second; an
  arrival takes a waiting session's next turn, else starts a new session; when every
  started session is mid-turn and none is left to start, the arrival waits (that wait
  shows as ``queue_s``). At most ``concurrency`` requests are in flight.

The run ends when ``duration_s`` has passed or ``max_requests`` were sent (nothing new
is sent after; requests in flight finish, each bounded by its timeout), when the
workload runs out, on Ctrl-C, or when the first ``ABORT_AFTER`` replies all failed (a
server that is down or rejects every request: the run stops with its first error).
``_Books`` keeps the shared state under one condition; the main thread only collects
records, so the caller's ``on_record`` (progress, JSONL) runs on the calling thread.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flatcake.loadgen.client import Reply
from flatcake.loadgen.workload import Session, Turn, Workload

ABORT_AFTER = 3
"""Replies that may fail before the first success ends the run."""


@dataclass(frozen=True, slots=True)
class Pacing:
    """How fast to send and when to stop (see the module docstring).

    Attributes:
        rate: Poisson arrivals per second (open loop); None: closed loop.
        concurrency: workers (closed loop) or most requests in flight (open loop).
        duration_s / max_requests: bounds on sending (None: no bound).
        seed: seeds the arrivals.
    """

    rate: float | None = None
    concurrency: int = 1
    duration_s: float | None = 60.0
    max_requests: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"--rate must be > 0 requests/s, got {self.rate}")
        if self.concurrency <= 0:
            raise ValueError(f"--concurrency must be > 0, got {self.concurrency}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"--duration must be > 0 s, got {self.duration_s}")
        if self.max_requests is not None and self.max_requests <= 0:
            raise ValueError(f"--max-requests must be > 0, got {self.max_requests}")


@dataclass(frozen=True, slots=True)
class Job:
    """One turn to send: where it belongs and what the client knows before sending."""

    index: int
    session: Session
    turn_index: int
    due_s: float
    reusable_tokens: int

    @property
    def turn(self) -> Turn:
        return self.session.turns[self.turn_index]

    @property
    def session_id(self) -> str:
        return self.session.session_id(self.turn_index)


@dataclass(frozen=True, slots=True)
class Record:
    """One request as the JSONL line records it (times in s from the run's start).

    ``reusable_tokens``: the prompt's leading tokens an earlier request already sent
    (what an infinite prefix cache could serve); ``queue_s``: sent minus due;
    ``blocks``: the prompt's block ids as runs of consecutive ids ``(first, end)``, so
    the JSONL says exactly which prompts shared which tokens (``report.realcheck``
    replays a run from it); the prompt's tokens past its blocks are its own.
    """

    index: int
    session_id: str
    turn: int
    due_s: float
    sent_s: float
    prompt_tokens_sent: int
    reusable_tokens: int
    reply: Reply
    blocks: tuple[tuple[int, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        r = self.reply
        return {"index": self.index, "session_id": self.session_id, "turn": self.turn,
                "due_s": round(self.due_s, 6), "sent_s": round(self.sent_s, 6),
                "queue_s": round(self.sent_s - self.due_s, 6),
                "ttft_s": r.ttft_s, "e2e_s": r.e2e_s,
                "prompt_tokens_sent": self.prompt_tokens_sent,
                "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
                "reusable_tokens": self.reusable_tokens,
                "completion_tokens": r.completion_tokens, "status": r.status,
                "error": r.error, "blocks": [list(b) for b in self.blocks]}


def id_runs(block_ids: np.ndarray) -> tuple[tuple[int, int], ...]:
    """``block_ids`` as runs of consecutive ids, each ``(first, end)`` (end exclusive)."""
    ids = np.asarray(block_ids, dtype=np.int64)
    if not len(ids):
        return ()
    cut = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate([[0], cut])
    ends = np.concatenate([cut, [len(ids)]])
    return tuple((int(ids[a]), int(ids[b - 1]) + 1) for a, b in zip(starts, ends,
                                                                     strict=True))


@dataclass(slots=True)
class RunResult:
    """Every record in completion order, the run's wall time and how it ended."""

    records: list[Record] = field(default_factory=list)
    wall_s: float = 0.0
    interrupted: bool = False
    aborted: str | None = None


Sender = Callable[[Job, list[int]], Reply]
"""Sends one job's prompt (token ids) and returns the reply; called on worker threads."""


class _Books:
    """Sessions started, waiting and in flight; every method holds ``_cond``."""

    def __init__(self, workload: Workload, pacing: Pacing, start: float,
                 seen: set[int] | None = None) -> None:
        self._cond = threading.Condition()
        self._sessions: Iterator[Session] = workload.sessions
        self._block_tokens = workload.block_tokens
        self._pacing = pacing
        self._start = start
        self._waiting: deque[tuple[Session, int]] = deque()
        self._seen: set[int] = set() if seen is None else seen
        self._in_flight = 0
        self._sent = 0
        self._exhausted = False
        self._failed_first = 0  # failures before the first success
        self._succeeded = False
        self.stopped = False
        self.aborted: str | None = None

    def _bounded(self) -> bool:
        p = self._pacing
        if self.stopped or (p.max_requests is not None and self._sent >= p.max_requests):
            return True
        return p.duration_s is not None and time.perf_counter() - self._start >= p.duration_s

    def take(self, due_s: float | None = None) -> Job | None:
        """The next turn to send (blocks while every session is mid-turn), or None when
        the run is over."""
        with self._cond:
            while not self._bounded():
                if not self._waiting and not self._exhausted:
                    s = next(self._sessions, None)
                    if s is None:
                        self._exhausted = True
                    elif s.turns:
                        self._waiting.append((s, 0))
                    continue
                if self._waiting:
                    session, k = self._waiting.popleft()
                    return self._job(session, k, due_s)
                if self._in_flight == 0:
                    return None
                self._cond.wait(0.2)
            return None

    def _job(self, session: Session, k: int, due_s: float | None) -> Job:
        ids = session.turns[k].block_ids.tolist()
        shared = 0
        for i in ids:  # chained ids: a seen id means its whole prefix was seen
            if i not in self._seen:
                break
            shared += 1
        self._seen.update(ids)
        self._in_flight += 1
        self._sent += 1
        now = time.perf_counter() - self._start
        return Job(index=self._sent - 1, session=session, turn_index=k,
                   due_s=now if due_s is None else due_s,
                   reusable_tokens=shared * self._block_tokens)

    def finish(self, job: Job, reply: Reply | None) -> None:
        """``job``'s reply is in (None: sending it raised)."""
        with self._cond:
            self._in_flight -= 1
            if reply is not None and reply.ok:
                self._succeeded = True
            elif not self._succeeded and self.aborted is None:
                self._failed_first += 1
                if self._failed_first >= ABORT_AFTER:
                    why = reply.error if reply is not None else "the sender raised"
                    self.aborted = f"the first {ABORT_AFTER} requests failed: {why}"
                    self.stopped = True
            if job.turn_index + 1 < len(job.session.turns):
                self._waiting.append((job.session, job.turn_index + 1))
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
            self._cond.notify_all()

    def sleep_until(self, t: float) -> None:
        """Wait until ``perf_counter() >= t`` or a stop."""
        with self._cond:
            while not self.stopped and (left := t - time.perf_counter()) > 0:
                self._cond.wait(left)

    def wait_idle(self) -> None:
        """Wait until no request is in flight."""
        with self._cond:
            while self._in_flight:
                self._cond.wait(0.2)


def run(workload: Workload, pacing: Pacing, send: Sender,
        on_record: Callable[[Record], None] = lambda r: None,
        seen: set[int] | None = None) -> RunResult:
    """Drive ``workload`` with ``pacing`` through ``send``; ``on_record`` sees each
    record on the calling thread as it completes. A second run of the same workload
    goes on with the sessions the first did not start (a warm-up, then the measured
    run); ``seen``, the block ids sent so far, carries what is reusable across them."""
    start = time.perf_counter()
    books = _Books(workload, pacing, start, seen)
    done: queue.Queue[Record | None] = queue.Queue()
    slots = threading.Semaphore(pacing.concurrency)

    def one(job: Job) -> None:
        reply = None
        try:
            prompt = workload.prompt(job.turn)
            sent = time.perf_counter() - start
            reply = send(job, prompt)
            done.put(Record(job.index, job.session_id, job.turn_index, job.due_s, sent,
                            len(prompt), job.reusable_tokens, reply,
                            id_runs(job.turn.block_ids)))
        finally:
            books.finish(job, reply)  # after the put: idle means every record is queued

    def closed_loop() -> None:
        while (job := books.take()) is not None:
            one(job)
        done.put(None)

    def in_slot(job: Job) -> None:
        try:
            one(job)
        finally:
            slots.release()

    def open_loop(rate: float) -> None:
        rng = random.Random(pacing.seed)
        due = 0.0
        while not books.stopped:
            due += rng.expovariate(rate)
            books.sleep_until(start + due)
            while not slots.acquire(timeout=0.2):
                if books.stopped:
                    break
            else:
                job = books.take(due_s=due)
                if job is None:
                    slots.release()
                    break
                # Daemon threads: Ctrl-C must not wait for replies still streaming.
                threading.Thread(target=in_slot, args=(job,), daemon=True).start()
        books.wait_idle()
        done.put(None)

    if pacing.rate is None:
        workers = [threading.Thread(target=closed_loop, daemon=True, name=f"loadgen-{i}")
                   for i in range(pacing.concurrency)]
    else:
        workers = [threading.Thread(target=open_loop, args=(pacing.rate,), daemon=True,
                                    name="loadgen-arrivals")]
    for w in workers:
        w.start()
    result = RunResult()
    live = len(workers)
    try:
        while live:
            rec = done.get()
            if rec is None:
                live -= 1
                continue
            result.records.append(rec)
            on_record(rec)
    except KeyboardInterrupt:
        result.interrupted = True
        books.stop()
    result.wall_s = time.perf_counter() - start
    result.aborted = books.aborted
    return result
