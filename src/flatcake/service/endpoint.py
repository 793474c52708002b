"""The node service's endpoint: its unix socket and the loop that answers calls.

Single-threaded: one loop (``selectors``) accepts connections, reads frames
(``link.frames``), answers and expires; the books need no lock, and there is no I/O
thread: a call costs the service one read and one write of its socket.

Connections: each holds one of the service's file descriptors. ``serve`` raises its
open-file soft limit to the hard limit at start (``raise_open_files``: systemd's default
soft limit is 1,024, its hard limit 524,288); when accepting finds none left (EMFILE)
the loop closes the connections that never called, the oldest first, and accepts
again on its next turn. A connection that has made no call within ``HANDSHAKE_S`` of
its accept (a raw socket held open) is closed. One uid holds at most
``store.node_max_connections_per_uid`` connections: past it, its longest-idle one is
closed (``service.connections``). A peer that does not read its answers (more than
``MAX_UNSENT_BYTES`` waiting to be sent) is closed.

Deadlines: a call carries the wall-clock time its client stops waiting; one read after
it is not run (its client gave up: what it would prepare would be no one's), and a
client names the calls it gave up on in its next call, whose effects are then undone
(``service.stores.abandon_calls``).

Frames: a call is decoded into the wire's ``Call`` and its arguments into its verb's
declared types (``link.wire``, ``link.verbs``); nothing is unpickled. A frame that does
not decode (random bytes, truncated, another protocol version, a pickle) is answered
with an error naming why, and the loop goes on; a frame longer than
``link.frames.MAX_FRAME_BYTES`` is refused by name and its connection closed.

Callers: who makes a call is its connection (``link.trust.Caller``: the loop's number
of it, and the peer's pid and uid from ``SO_PEERCRED`` where the platform says), never
the id a call names; the service binds each attached engine or store to the caller that
attached it (``link.trust.Owner``).
"""

from __future__ import annotations

import errno
import itertools
import logging
import resource
import selectors
import socket
import threading
import time
from pathlib import Path
from typing import Any

from flatcake.control import ControlPlane
from flatcake.link import wire
from flatcake.link.frames import RECV_BYTES, Framer, FrameTooLarge, framed
from flatcake.link.trust import Caller, peer_credentials
from flatcake.link.verbs import STATUS, Verb
from flatcake.service.connections import ConnectionCap
from flatcake.service.stores import AttachedStore, ServableWait

logger = logging.getLogger("flatcake.service")

HANDSHAKE_S = 5.0  # a connection silent this long after it was accepted is closed
FEW_OPEN_FILES = 16384  # below this, warn: a client leaking connections could stop us
_UNLIMITED_OPEN_FILES = 1 << 20  # what an unlimited hard limit is taken as (nr_open)
MAX_UNSENT_BYTES = 256 << 20  # answers a peer left unread past which it is closed
BACKLOG = 1024  # connections the kernel queues before the loop accepts them
# A ZeroMQ peer's first bytes (ZMTP 3 signature: 0xFF, 8 padding bytes, 0x7F).
ZMTP_SIGNATURE = b"\xff" + bytes(8) + b"\x7f"


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


class _Peer:
    """One connection: its socket, what it sent so far, what waits to be sent."""

    __slots__ = ("accepted", "called", "caller", "framer", "sock", "unsent")

    def __init__(self, sock: socket.socket, caller: Caller, now: float) -> None:
        self.sock, self.caller = sock, caller
        self.framer = Framer()
        self.unsent = bytearray()
        self.accepted, self.called = now, False


class CallLoop:
    """The serving loop of ``server.NodeService`` (which answers each call). Owned by
    the thread that runs ``serve``."""

    lease_s: float
    verb_table: dict[str, Verb]  # every verb it answers, by name
    _listener: socket.socket
    _conns: ConnectionCap
    _waits: list[tuple[int, int, ServableWait]]
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

    def _listen(self, path: Path) -> None:
        """Listen on ``path`` (the caller set the umask and checked the directory)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(path))
            listener.listen(BACKLOG)
        except OSError:
            listener.close()
            raise
        listener.setblocking(False)
        self._listener = listener
        self._peers: dict[int, _Peer] = {}  # by connection number
        self._old_pids: set[int | None] = set()  # ZeroMQ engines told to upgrade
        self._numbers = itertools.count(1)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._accepting = True

    def serve(self, stop: threading.Event) -> None:
        """Answer calls until ``stop`` is set."""
        tick = min(1.0, self.lease_s / 4)
        next_expiry = time.monotonic() + tick
        select = self._selector.select
        while not stop.is_set():
            wait_s = 0.1
            if self._waits:
                first = min(w.deadline for _, _, w in self._waits)
                wait_s = max(0.0, min(wait_s, first - time.monotonic() + 0.001))
            for key, events in select(wait_s):
                if key.data is None:
                    self._accept()
                elif events & selectors.EVENT_READ:
                    self._read(key.data)
                else:
                    self._flush(key.data)
            now = time.monotonic()
            if now >= next_expiry:
                self._sweep(now)
                self.expire()
                next_expiry = time.monotonic() + tick
            if self._waits:
                self._answer_waits(time.monotonic())

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
                self._out_of_files()
                return
            sock.setblocking(False)
            creds = peer_credentials(sock)
            peer = _Peer(sock, Caller(next(self._numbers), creds), time.monotonic())
            self._peers[peer.caller.connection] = peer
            self._conns.accepted(sock.fileno(), creds[1] if creds else None, peer.accepted)
            self._selector.register(sock, selectors.EVENT_READ, peer)

    def _out_of_files(self) -> None:
        """No descriptor left to accept with: close the connections that never called
        (oldest first, half of them), else stop accepting until the next tick."""
        silent = sorted((p for p in self._peers.values() if not p.called),
                        key=lambda p: p.accepted)
        logger.warning("out of open files with %d connections (%d never called): the "
                       "oldest silent ones are closed", len(self._peers), len(silent))
        for peer in silent[:max(1, len(silent) // 2)]:
            self._close(peer)
        if not silent and self._accepting:
            self._selector.unregister(self._listener)
            self._accepting = False

    def _sweep(self, now: float) -> None:
        """The tick's connection work: accept again, close the silent and those over
        their uid's cap."""
        if not self._accepting:
            self._selector.register(self._listener, selectors.EVENT_READ, None)
            self._accepting = True
        for peer in [p for p in self._peers.values()
                     if not p.called and now - p.accepted > HANDSHAKE_S]:
            self._close(peer)
        over = set(self._conns.over(now))
        for peer in [p for p in self._peers.values() if p.sock.fileno() in over]:
            self._close(peer)

    def _close(self, peer: _Peer) -> None:
        if self._peers.pop(peer.caller.connection, None) is None:
            return
        self._conns.forget(peer.sock.fileno())
        self._selector.unregister(peer.sock)
        peer.sock.close()

    def _read(self, peer: _Peer) -> None:
        """Answer every call ``peer`` sent that is whole; a frame that is not one is
        refused, never raised out of the loop (one peer's bytes must not stop every
        engine's service)."""
        try:
            data = peer.sock.recv(RECV_BYTES)
        except OSError:
            data = b""
        if not data:
            self._close(peer)
            return
        if not peer.called and data[:1] == ZMTP_SIGNATURE[:1] and len(data) >= 10 and \
                data[9] == ZMTP_SIGNATURE[9]:
            self._old_engine(peer)
            return
        try:
            frames = peer.framer.feed(data)
        except FrameTooLarge as exc:
            self._send(peer.caller.connection, wire.refusal_frame(
                None, f"malformed call: {exc}; the connection is closed"))
            self._close(peer)
            return
        for frame in frames:
            peer.called = True
            self._answer(peer, frame)

    def _old_engine(self, peer: _Peer) -> None:
        """A ZeroMQ greeting: an engine whose FlatCake speaks the wire before protocol
        5 (ZeroMQ). Said once per process (ZeroMQ reconnects on its own), then closed."""
        pid = peer.caller.credentials[0] if peer.caller.credentials else None
        if pid not in self._old_pids:
            self._old_pids.add(pid)
            logger.error("connection %d (pid %s) speaks ZeroMQ: an engine with a FlatCake "
                         "older than wire protocol %d; upgrade FlatCake there (it serves "
                         "without the node service until then)", peer.caller.connection,
                         pid, wire.PROTOCOL_VERSION)
        self._close(peer)

    def _send(self, who: int, frame: bytes) -> None:
        """Send ``frame`` to connection ``who`` (gone: dropped). What the socket does not
        take now is sent as it drains, so this never blocks the loop."""
        peer = self._peers.get(who)
        if peer is None:
            return
        data = framed(frame)
        if not peer.unsent:
            try:
                sent = peer.sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._close(peer)
                return
            if sent == len(data):
                return
            data = data[sent:]
            self._selector.modify(peer.sock, selectors.EVENT_READ | selectors.EVENT_WRITE,
                                  peer)
        peer.unsent += data
        if len(peer.unsent) > MAX_UNSENT_BYTES:
            logger.warning("connection %d leaves its answers unread: closed",
                           peer.caller.connection)
            self._close(peer)

    def _flush(self, peer: _Peer) -> None:
        try:
            sent = peer.sock.send(peer.unsent)
        except BlockingIOError:
            return
        except OSError:
            self._close(peer)
            return
        del peer.unsent[:sent]
        if not peer.unsent:
            self._selector.modify(peer.sock, selectors.EVENT_READ, peer)

    def _refuse(self, who: int, why: str, call_id: int | None = None) -> None:
        """Answer a message that is not a call (or not one we can read)."""
        self._send(who, wire.refusal_frame(call_id, f"malformed call: {why}"))

    def _answer(self, peer: _Peer, frame: bytes) -> None:
        """Answer one call of ``peer`` (see ``_read``)."""
        who = peer.caller.connection
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
        caller = peer.caller
        self._conns.touch(peer.sock.fileno(), time.monotonic())
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

    def _stop_listening(self) -> None:
        """Close every connection and the listener."""
        for peer in list(getattr(self, "_peers", {}).values()):
            self._close(peer)
        listener = getattr(self, "_listener", None)
        if listener is not None:
            listener.close()
            self._selector.close()


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
