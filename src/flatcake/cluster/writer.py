"""The member's writes to the cluster index, applied in order and re-queued while Redis
fails (``IndexWriter``; ``cluster.service.ClusterService`` owns one, on its thread).

A store queues ``publish`` (a segment became durable) and ``remove`` (its books dropped
it). Every entry waits in one ordered backlog, keyed by segment id, until Redis takes
it::

    publish      appended at the end
    remove       takes the place of that segment's publish when it is still waiting (so
                 it is never published after it was withdrawn) and goes at the end: a
                 publish that timed out may have reached Redis, and a removal only
                 deletes what is still that segment's (``ClusterIndex.remove``)
    apply        the backlog in order, consecutive entries of one kind in one pipeline;
                 the first batch Redis fails stops the round, it and everything after it
                 wait (the back-off doubles from ``retry_s[0]`` to ``retry_s[1]``), then
                 are tried again in the same order; an entry leaves the backlog once
                 Redis took it, so nothing is sent again after it succeeded
    bound        at most ``limit`` segments wait; past that the oldest publish is dropped
                 (counted in ``dropped``, logged: its blocks miss remotely, nothing
                 wrong is served), or the oldest removal when no publish waits

Not thread-safe: ``put`` and ``apply`` run on one thread (the service's), or under the
caller's lock.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

logger = logging.getLogger(__name__)


class _Index(Protocol):
    def publish(self, segments: Sequence[Any]) -> bool: ...

    def remove(self, segments: Sequence[tuple[int, Sequence[bytes]]]) -> bool: ...


class IndexWriter:
    """Publishes and removals of one member, in order, held while Redis fails."""

    def __init__(self, index: _Index, *, limit: int = 65536,
                 retry_s: tuple[float, float] = (0.5, 5.0),
                 now: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an int >= 1, got {limit!r}")
        if retry_s[0] <= 0 or retry_s[1] < retry_s[0]:
            raise ValueError(f"retry_s must be (first > 0, longest >= first), got {retry_s!r}")
        self.index, self.limit, self.retry_s, self._now = index, limit, retry_s, now
        self._waiting: OrderedDict[int, tuple[str, Any]] = OrderedDict()
        self._retry_at = float("-inf")
        self._wait = retry_s[0]
        self.published = self.removed = self.dropped = self.failures = 0

    def __len__(self) -> int:
        """Segments waiting for Redis."""
        return len(self._waiting)

    def waiting(self) -> list[tuple[str, int]]:
        """``(kind, segment_id)`` of every waiting entry, in the order they go."""
        return [(kind, sid) for sid, (kind, _) in self._waiting.items()]

    def put(self, kind: str, segments: Sequence[Any]) -> None:
        """Queue ``publish`` of ``(segment_id, keys, addresses, record)`` entries or
        ``remove`` of ``(segment_id, keys)`` ones, after everything queued before."""
        if kind not in ("publish", "remove"):
            raise ValueError(f"kind must be 'publish' or 'remove', got {kind!r}")
        for seg in segments:
            sid = seg[0]
            self._waiting.pop(sid, None)
            self._waiting[sid] = (kind, seg)
        while len(self._waiting) > self.limit:
            oldest = next((sid for sid, (k, _) in self._waiting.items() if k == "publish"),
                          next(iter(self._waiting)))
            kind_dropped, _ = self._waiting.pop(oldest)
            self.dropped += 1
            logger.warning("cluster index: more than %d segments wait for Redis; the %s of "
                           "segment %d is dropped", self.limit, kind_dropped, oldest)

    def apply(self) -> bool:
        """Send what waits, in order, unless backing off; whether anything was sent."""
        if not self._waiting or self._now() < self._retry_at:
            return False
        while self._waiting:
            kind = next(iter(self._waiting.values()))[0]
            batch = []
            for k, seg in self._waiting.values():
                if k != kind:
                    break
                batch.append(seg)
            try:
                ok = (self.index.publish(batch) if kind == "publish"
                      else self.index.remove(batch))
            except Exception as exc:  # redis or socket trouble: retried
                ok = False
                logger.warning("cluster index %s of %d segments failed: %s", kind,
                               len(batch), exc)
            if not ok:
                self.failures += 1
                self._retry_at = self._now() + self._wait
                logger.warning("cluster index: %d segments wait for Redis (%s failed); next "
                               "try in %.1f s", len(self._waiting), kind, self._wait)
                self._wait = min(self._wait * 2, self.retry_s[1])
                return True
            for seg in batch:
                del self._waiting[seg[0]]
            if kind == "publish":
                self.published += len(batch)
            else:
                self.removed += len(batch)
        self._wait = self.retry_s[0]
        return True
