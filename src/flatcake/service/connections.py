"""Connections per uid, capped: a flood of connections from one user cannot starve a
real client. The service's loop tells ``ConnectionCap`` of each connection it accepts
(with its peer's uid, ``SO_PEERCRED``), each call it reads and each connection that
ends; once one uid holds more than ``store.node_max_connections_per_uid``, ``over``
names its connections idle the longest, which the loop closes (a client connects again
when it calls again), so the newest connection, a real client attaching, is answered.
A connection is never named within ``GRACE_S`` of its accept or its last call: a real
client's connection may be accepted among a flood's, before its first call is read,
and closing it then would lose that call. 0 turns the cap off.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

logger = logging.getLogger("flatcake.service")

GRACE_S = 1.0  # a connection this fresh (accepted or called) is never shut by the cap


class ConnectionCap:
    """The live connections of the service's socket, by uid (see the module). Owned by
    the service's loop thread."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._uid: dict[int, int] = {}  # descriptor -> peer uid
        self._last: dict[int, float] = {}  # descriptor -> last call (monotonic)
        self._per_uid: Counter[int] = Counter()
        self.closed = 0  # connections shut down by the cap

    @property
    def connections(self) -> int:
        """The live connections counted (those whose uid was read)."""
        return len(self._uid)

    def accepted(self, fd: int, uid: int | None, now: float | None = None) -> None:
        """Connection ``fd`` of a peer of ``uid`` (None: unknown, not counted)."""
        self.forget(fd)  # a reused descriptor
        if self.cap <= 0 or uid is None:
            return
        self._uid[fd] = uid
        self._last[fd] = time.monotonic() if now is None else now
        self._per_uid[uid] += 1

    def touch(self, fd: int, now: float) -> None:
        """Connection ``fd`` made a call."""
        if fd in self._last:
            self._last[fd] = now

    def forget(self, fd: int) -> None:
        """Connection ``fd`` ended."""
        uid = self._uid.pop(fd, None)
        self._last.pop(fd, None)
        if uid is not None:
            self._per_uid[uid] -= 1

    def over(self, now: float | None = None) -> list[int]:
        """The connections to close: of each uid over the cap, its longest-idle ones
        idle for at least ``GRACE_S`` (forgotten here; the loop closes them)."""
        now = time.monotonic() if now is None else now
        out = []
        for uid in [u for u, n in self._per_uid.items() if n > self.cap]:
            mine = sorted((f for f, u in self._uid.items() if u == uid),
                          key=self._last.__getitem__)
            for fd in mine[:len(mine) - self.cap]:
                if now - self._last[fd] < GRACE_S:
                    break  # sorted: every later one is fresher still
                self.forget(fd)
                self.closed += 1
                if self.closed == 1 or self.closed % 1000 == 0:
                    logger.warning("uid %d holds over %d connections "
                                   "(store.node_max_connections_per_uid): its idle ones "
                                   "are closed (%d so far)", uid, self.cap, self.closed)
                out.append(fd)
        return out
