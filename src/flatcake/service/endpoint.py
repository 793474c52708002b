"""The node service's endpoint: its unix socket and the loop that answers calls.

Single-threaded: one loop receives, answers and expires; the books need no lock.

Connections: each holds one of the service's file descriptors, and ZeroMQ (4.3) aborts
the process when accepting one finds none left (EMFILE), so a flood of idle connections
would stop every engine's service. ``serve`` raises its open-file soft limit to the hard
limit at start (``raise_open_files``: systemd's default soft limit is 1,024, its hard
limit 524,288), and a connection that has not completed ZeroMQ's handshake within
``HANDSHAKE_S`` (a raw socket held open) is closed. One uid holds at most
``store.node_max_connections_per_uid`` connections: past it, its longest-idle one is
closed (``service.connections``).

Deadlines: a call carries the wall-clock time its client stops waiting; one read after
it is not run (its client gave up: what it would prepare would be no one's), and a
client names the calls it gave up on in its next call, whose effects are then undone
(``service.stores.abandon_calls``).

Frames: a call is decoded into the wire's ``Call`` and its arguments into its verb's
declared types (``link.wire``, ``link.verbs``); nothing is unpickled. A frame that does
not decode (random bytes, truncated, oversized, another protocol version, a pickle, the
wrong number of frames) is answered with an error naming why, and the loop goes on.

Callers: who makes a call is its connection (``link.trust.Caller``: ZeroMQ's routing id,
and the peer's pid and uid from ``SO_PEERCRED`` where the platform says), never the id a
call names; the service binds each attached engine or store to the caller that attached
it (``link.trust.Owner``).
"""

from __future__ import annotations

import logging
import resource
import socket
import threading
import time
from pathlib import Path
from typing import Any, cast

import zmq

from flatcake.control import ControlPlane
from flatcake.link import wire
from flatcake.link.trust import Caller
from flatcake.link.verbs import STATUS, Verb
from flatcake.service.connections import ConnectionCap
from flatcake.service.stores import AttachedStore, ServableWait

logger = logging.getLogger("flatcake.service")

HANDSHAKE_S = 5.0  # a connection silent this long after it was accepted is closed
FEW_OPEN_FILES = 16384  # below this, warn: a client leaking connections could stop us
_UNLIMITED_OPEN_FILES = 1 << 20  # what an unlimited hard limit is taken as (nr_open)


def raise_open_files() -> int:
    """Raise this process's open-file soft limit to its hard limit (each connection
    holds a descriptor; see the module); the soft limit now. Warns when it stays low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = _UNLIMITED_OPEN_FILES if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as exc:
            logger.warning("could not raise the open-file limit from %d to %d: %s", soft,
                           want, exc)
        else:
            logger.info("open-file limit raised from %d to %d (one per connection)",
                        soft, want)
            soft = want
    if soft != resource.RLIM_INFINITY and soft < FEW_OPEN_FILES:
        logger.warning("the service may hold %d open files (connections among them): a "
                       "client that leaks connections could stop it; raise the hard "
                       "limit (systemd LimitNOFILE=, ulimit -Hn)", soft)
    return soft


def listening(path: Path) -> bool:
    """Whether a live process accepts connections on the unix socket ``path``."""
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


class CallLoop:
    """The serving loop of ``server.NodeService`` (which answers each call)."""

    lease_s: float
    verb_table: dict[str, Verb]  # every verb it answers, by name
    _sock: zmq.Socket[bytes]
    _conns: ConnectionCap
    _waits: list[tuple[bytes, int, ServableWait]]
    _stores: dict[str, AttachedStore]

    def handle(self, method: str, engine_id: str, args: dict[str, Any],
               caller: Caller, call_id: int = 0) -> Any:
        raise NotImplementedError

    def gave_up(self, engine_id: str, caller: Caller, call_ids: tuple[int, ...]) -> None:
        raise NotImplementedError

    def expire(self, now: float | None = None) -> int:
        raise NotImplementedError

    def _books(self) -> ControlPlane:
        raise NotImplementedError

    def serve(self, stop: threading.Event) -> None:
        """Answer calls until ``stop`` is set."""
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        if self._conns.monitor is not None:
            poller.register(self._conns.monitor, zmq.POLLIN)
        tick = min(1.0, self.lease_s / 4)
        next_expiry = time.monotonic() + tick
        while not stop.is_set():
            wait_ms = 100
            if self._waits:
                first = min(w.deadline for _, _, w in self._waits)
                wait_ms = max(0, min(wait_ms, int((first - time.monotonic()) * 1000) + 1))
            ready = poller.poll(wait_ms)
            if ready:
                if len(ready) > 1 or ready[0][0] is not self._sock:
                    self._conns.drain()  # the monitor's events (accepted, closed)
                self._take_calls()
            if time.monotonic() >= next_expiry:
                self._conns.drain()  # connections over the cap whose grace ended
                self.expire()
                next_expiry = time.monotonic() + tick
            if self._waits:
                self._answer_waits(time.monotonic())

    def _take_calls(self) -> None:
        """Answer every call the socket holds. Read while ZeroMQ says one is there
        (``EVENTS``), so an empty socket costs no raised ``zmq.Again`` per wakeup."""
        sock = self._sock
        while cast(int, sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            try:
                got = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            who, frames = got[0].bytes, got[1:]
            if len(frames) == 1:
                self._answer(who, frames[0].bytes, frames[0].get(zmq.SRCFD))
            else:  # a call is one frame (a DEALER's send_multipart is not one)
                self._refuse(who, f"{len(frames)} frames, a call is one")

    def _send(self, who: bytes, frame: bytes) -> None:
        """Send ``frame`` to connection ``who`` (a ROUTER drops what it cannot deliver,
        so this never blocks the loop)."""
        self._sock.send(who, zmq.SNDMORE)
        self._sock.send(frame)

    def _refuse(self, who: bytes, why: str, call_id: int | None = None) -> None:
        """Answer a message that is not a call (or not one we can read)."""
        self._send(who, wire.refusal_frame(call_id, f"malformed call: {why}"))

    def _answer(self, who: bytes, frame: bytes, fd: int = -1) -> None:
        """Answer one call of connection ``who`` (descriptor ``fd``); a frame that is
        not one is refused, never raised out of the loop (one peer's bytes must not stop
        every engine's service)."""
        try:
            call = wire.decode_call(frame)
        except wire.BadFrame as exc:
            self._refuse(who, str(exc), exc.call_id)
            return
        method, engine_id, call_id = call.verb, call.client_id, call.call_id
        verb = self.verb_table.get(method)
        if verb is None:
            self._send(who, wire.refusal_frame(call_id, f"unknown call {method!r}"))
            return
        try:
            args = verb.decode_args(call.args)
        except Exception as exc:  # wire.FrameError, or a value's own check refusing it
            self._refuse(who, f"the arguments of {method}: {exc}", call_id)
            return
        caller = Caller(who, fd)
        self._conns.touch(fd)
        try:
            if call.gave_up:  # first: one of them may be a call still queued
                self.gave_up(engine_id, caller, call.gave_up)
            if call.deadline is not None and time.time() > call.deadline:
                # Queued past its client's wait (the service paused, busy): running it
                # now would leave what it prepares to no one.
                late = time.time() - call.deadline
                raise wire.NodeRefused(f"{method} not run: {wire.GAVE_UP} "
                                       f"{late:.3f} s ago")
            out = self.handle(method, engine_id, args, caller, call_id)
            if isinstance(out, ServableWait):  # answered by ``_answer_waits``
                self._waits.append((who, call_id, out))
                return
            reply = wire.answer_frame(call_id, out)
        except wire.NodeRefused as exc:
            reply = wire.refusal_frame(call_id, str(exc))
        except Exception as exc:
            logger.exception("call %s of engine %s failed", method, engine_id)
            reply = wire.refusal_frame(call_id, f"{type(exc).__name__}: {exc}")
        self._send(who, reply)

    def _answer_waits(self, now: float) -> None:
        """Answer the held ``servable`` calls whose store in flight ended (durable,
        failed, or rolled back with its lease), whose store left, or whose wait is up."""
        held = []
        for who, call_id, wait in self._waits:
            found = wait.answer(self._books(), now, wait.client_id in self._stores)
            if found is None:
                held.append((who, call_id, wait))
            else:
                self._send(who, wire.answer_frame(call_id, found))
        self._waits = held


def ask_status(sock: Path, timeout_s: float, group: str = "") -> dict[str, Any]:
    """What the service listening on ``sock`` serves (``flatcake serve --status``; a
    service of socket group ``group`` trusted too); raises ``NodeUnavailable`` /
    ``NodeRefused``."""
    from flatcake.link.client import NodeClient

    client = NodeClient(str(sock), timeout_s, group)
    try:
        out: dict[str, Any] = client.call(STATUS)
        return out
    finally:
        client.close()
