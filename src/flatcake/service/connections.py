"""Connections per uid, capped: a flood of connections from one user cannot starve a
real client. The service watches its socket's accepted and closed connections
(ZeroMQ's socket monitor: each event names the connection's descriptor), reads each
one's uid (``SO_PEERCRED``) and the time of its last call; once one uid holds more than
``store.node_max_connections_per_uid``, its connection idle the longest is shut down
(the client's ZeroMQ reconnects it when it calls again), so the newest connection, a
real client attaching, is answered. A connection is never shut within ``GRACE_S`` of
its accept or its last call: ZeroMQ connects in the background, so a real client's
connection may be accepted among a flood's, before its first call is read, and shutting
it then would lose that call. 0 turns the cap off.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import Counter

import zmq
from zmq.utils.monitor import recv_monitor_message

from flatcake.link.trust import peer_credentials

logger = logging.getLogger("flatcake.service")

EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
GRACE_S = 1.0  # a connection this fresh (accepted or called) is never shut by the cap


class ConnectionCap:
    """The live connections of a ROUTER socket, by uid (see the module)."""

    def __init__(self, sock: zmq.Socket[bytes], cap: int) -> None:
        self.cap = cap
        self.monitor = sock.get_monitor_socket(EVENTS) if cap > 0 else None
        self._uid: dict[int, int] = {}  # descriptor -> peer uid
        self._last: dict[int, float] = {}  # descriptor -> last call (monotonic)
        self._per_uid: Counter[int] = Counter()
        self.closed = 0  # connections shut down by the cap

    @property
    def connections(self) -> int:
        """The live connections counted (those whose uid was read)."""
        return len(self._uid)

    def touch(self, fd: int) -> None:
        """Connection ``fd`` made a call."""
        if fd in self._last:
            self._last[fd] = time.monotonic()

    def drain(self, now: float | None = None) -> None:
        """Take the monitor's events (count new connections, forget closed ones),
        then shut down the longest-idle connections of each uid over the cap, those
        idle for at least ``GRACE_S`` (the service's loop calls this on every event and
        on its tick, so a flood's connections are shut once their grace ends)."""
        if self.monitor is None:
            return
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._accepted(fd)
            else:
                self._forget(fd)
        now = time.monotonic() if now is None else now
        for uid in [u for u, n in self._per_uid.items() if n > self.cap]:
            mine = sorted((f for f, u in self._uid.items() if u == uid),
                          key=self._last.__getitem__)
            for fd in mine[:len(mine) - self.cap]:
                if now - self._last[fd] < GRACE_S:
                    break  # sorted: every later one is fresher still
                self._shut(fd, uid)

    def _accepted(self, fd: int) -> None:
        self._forget(fd)  # a reused descriptor
        try:
            creds = peer_credentials(fd)
        except OSError:  # closed already (an event read late)
            return
        if creds is None:
            return
        uid = creds[1]
        self._uid[fd], self._last[fd] = uid, time.monotonic()
        self._per_uid[uid] += 1

    def _forget(self, fd: int) -> None:
        uid = self._uid.pop(fd, None)
        self._last.pop(fd, None)
        if uid is not None:
            self._per_uid[uid] -= 1

    def _shut(self, fd: int, uid: int) -> None:
        """Shut connection ``fd`` down (ZeroMQ sees it end and closes it)."""
        self._forget(fd)
        self.closed += 1
        if self.closed == 1 or self.closed % 1000 == 0:
            logger.warning("uid %d holds over %d connections "
                           "(store.node_max_connections_per_uid): its idle ones are "
                           "closed (%d so far)", uid, self.cap, self.closed)
        try:
            conn = socket.socket(fileno=os.dup(fd))
        except OSError:
            return
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close(0)
            self.monitor = None
