"""The member's writes to the cluster index: one bounded, ordered queue, held until the
member joins and while Redis fails (``IndexWriter``; ``cluster.service.ClusterService``
owns one and applies it on its thread).

A store queues ``publish`` (a segment became durable) and ``remove`` (its books dropped
it) from any thread. Every entry waits in one ordered backlog, keyed by segment id,
until Redis takes it::

    publish      appended at the end
    remove       takes the place of that segment's publish when it is still waiting (so
                 it is never published after it was withdrawn) and goes at the end: a
                 publish that timed out may have reached Redis, and a removal only
                 deletes what is still that segment's (``ClusterIndex.remove``); before
                 the first send (the member has not joined yet) nothing of this writer
                 can be in Redis, so a removal only cancels its segment's publish
    apply        the backlog in order, consecutive entries of one kind in one pipeline
                 (sent outside the lock: a store never waits for Redis); the first
                 batch Redis fails stops the round, it and everything after it wait
                 (the back-off doubles from ``retry_s[0]`` to ``retry_s[1]``), then are
                 tried again in the same order; an entry leaves the backlog once Redis
                 took it, so nothing is sent again after it succeeded
    bound        at most ``limit`` segments wait; past that the oldest publish is dropped
                 (counted in ``dropped``, logged: its blocks miss remotely, nothing
                 wrong is served), or the oldest removal when no publish waits

``put`` from any thread; ``apply`` from one (the service's).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

logger = logging.getLogger(__name__)


class _Index(Protocol):
    def publish(self, segments: Sequence[Any]) -> bool: ...

    def remove(self, segments: Sequence[tuple[int, Sequence[bytes]]]) -> bool: ...


class IndexWriter:
    """Publishes and removals of one member, in order, held until Redis takes them."""

    def __init__(self, index: _Index, *, limit: int = 65536,
                 retry_s: tuple[float, float] = (0.5, 5.0),
                 now: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an int >= 1, got {limit!r}")
        if retry_s[0] <= 0 or retry_s[1] < retry_s[0]:
            raise ValueError(f"retry_s must be (first > 0, longest >= first), got {retry_s!r}")
        self.index, self.limit, self.retry_s, self._now = index, limit, retry_s, now
        self._changed = threading.Condition()  # guards the backlog and the flags
        self._waiting: OrderedDict[int, tuple[str, Any]] = OrderedDict()
        self._sent = self._failing = self._closed = False
        self._retry_at = float("-inf")  # the applying thread's
        self._wait = retry_s[0]
        self.published = self.removed = self.dropped = self.failures = 0

    def __len__(self) -> int:
        """Segments waiting for Redis."""
        return len(self._waiting)

    def waiting(self) -> list[tuple[str, int]]:
        """``(kind, segment_id)`` of every waiting entry, in the order they go."""
        with self._changed:
            return [(kind, sid) for sid, (kind, _) in self._waiting.items()]

    def put(self, kind: str, segments: Sequence[Any]) -> None:
        """Queue ``publish`` of ``(segment_id, keys, addresses, record)`` entries or
        ``remove`` of ``(segment_id, keys)`` ones, after everything queued before."""
        if kind not in ("publish", "remove"):
            raise ValueError(f"kind must be 'publish' or 'remove', got {kind!r}")
        with self._changed:
            for seg in segments:
                sid = seg[0]
                self._waiting.pop(sid, None)
                if kind == "publish" or self._sent:
                    self._waiting[sid] = (kind, seg)
            while len(self._waiting) > self.limit:
                oldest = next((sid for sid, (k, _) in self._waiting.items()
                               if k == "publish"), next(iter(self._waiting)))
                kind_dropped, _ = self._waiting.pop(oldest)
                self.dropped += 1
                logger.warning("cluster index: more than %d segments wait for Redis; the "
                               "%s of segment %d is dropped", self.limit, kind_dropped,
                               oldest)

    def apply(self) -> bool:
        """Send what waits, in order, unless backing off; whether anything was sent."""
        if not self._waiting or self._now() < self._retry_at:
            return False
        while batch := self._batch():
            kind = batch[0][1][0]
            try:
                ok = (self.index.publish([seg for _, (_, seg) in batch]) if kind == "publish"
                      else self.index.remove([seg for _, (_, seg) in batch]))
            except Exception as exc:  # redis or socket trouble: retried
                ok = False
                logger.warning("cluster index %s of %d segments failed: %s", kind,
                               len(batch), exc)
            with self._changed:
                self._failing = not ok
                self._changed.notify_all()
                if not ok:
                    break
                for sid, entry in batch:  # unless a later put replaced it meanwhile
                    if self._waiting.get(sid) is entry:
                        del self._waiting[sid]
            if kind == "publish":
                self.published += len(batch)
            else:
                self.removed += len(batch)
        if self._failing:
            self.failures += 1
            self._retry_at = self._now() + self._wait
            logger.warning("cluster index: %d segments wait for Redis; next try in %.1f s",
                           len(self), self._wait)
            self._wait = min(self._wait * 2, self.retry_s[1])
        else:
            self._wait = self.retry_s[0]
        return True

    def _batch(self) -> list[tuple[int, tuple[str, Any]]]:
        """The next waiting entries of one kind, in order."""
        with self._changed:
            batch: list[tuple[int, tuple[str, Any]]] = []
            for sid, entry in self._waiting.items():
                if batch and entry[0] != batch[0][1][0]:
                    break
                batch.append((sid, entry))
            self._sent = self._sent or bool(batch)
            return batch

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until nothing waits, Redis failed (what waits is
        retried) or the writer closed; False on timeout."""
        with self._changed:
            return self._changed.wait_for(
                lambda: not self._waiting or self._failing or self._closed, timeout_s)

    def close(self) -> None:
        """No more rounds: ``wait`` returns."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
