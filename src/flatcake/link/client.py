"""A bounded call to the node service (``NodeClient``) and a worker's files from it
(``worker_root``): what every host attached to the service uses (the vLLM halves, the
store, the SGLang backend through the store).
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Callable
from typing import Any

from flatcake.geometry import KVGeometry
from flatcake.link import trust, verbs, wire
from flatcake.link.frames import Connection, FrameTooLarge
from flatcake.link.verbs import Verb
from flatcake.link.wire import TensorRanks, WorkerRoot


class NodeClient:
    """One socket to the node service; ``call`` waits at most ``timeout_s``. ``group``:
    ``store.node_socket_group``, whose service this client also trusts
    (``link.trust.check_service``)."""

    def __init__(self, node: str, timeout_s: float, group: str = "") -> None:
        self.path = wire.socket_path(node)
        self.timeout_ms = max(1, int(timeout_s * 1000))
        self.group = group
        self._gid = trust.socket_group(group)
        self._sock: Connection | None = None
        # Call ids unique to this client (another client of the process may call as the
        # same store): the calls it gives up on are named to the service by id.
        self._ids = itertools.count(secrets.randbits(48) << 12)
        self._gave_up: list[int] = []  # named in the next call, until it is answered

    def _socket(self) -> Connection:
        if self._sock is None:
            # Before a byte goes out or a reply is read: the socket and the process
            # listening on it are ours or root's (its directory no one else can write).
            timeout_s = self.timeout_ms / 1000
            trust.check_service(self.path, timeout_s, self._gid)
            try:
                self._sock = Connection(str(self.path), timeout_s)
            except OSError as exc:
                raise wire.NodeUnavailable(f"no node service listens on {self.path} "
                                           f"({exc})") from None
        return self._sock

    def _send(self, frame: bytes) -> Connection:
        """Send ``frame`` on this client's connection; once more on a new one when the
        service closed the old (it restarted: nothing of the frame was read)."""
        for again in (False, True):
            sock = self._socket()
            try:
                sock.send(frame)
                return sock
            except OSError:
                self.reset()
                if again:
                    raise
        raise AssertionError("unreachable")

    def call(self, verb: Verb, client_id: str = "", *args: Any, wait_s: float = 0.0,
             **kwargs: Any) -> Any:
        """The service's answer to ``verb`` (its arguments ``args``, ``kwargs``) as
        ``client_id``, decoded into the verb's reply type; ``NodeUnavailable`` past the
        timeout (plus ``wait_s`` for a call the service may hold that long; the
        connection is then renewed, so a late answer never meets a later call) or when
        the service closed the connection, ``NodeRefused`` for an error it answered (or
        an answer that is not the verb's). The call carries its deadline (the service
        does not run it once that has passed) and the calls this client gave up on
        since its last answer (the service undoes what they prepared: their answers
        were never seen)."""
        body = verb.encode_args(*args, **kwargs)
        call_id = next(self._ids)
        wait = self.timeout_ms / 1000 + wait_s
        frame = wire.call_frame(call_id, client_id, verb.name, body, time.time() + wait,
                                tuple(self._gave_up))
        deadline = time.monotonic() + wait
        try:
            sock = self._send(frame)
        except FrameTooLarge as exc:
            raise wire.NodeRefused(f"{verb.name}: {exc}") from None
        except wire.NodeUnavailable:  # none listens, or one we do not trust
            raise
        except OSError as exc:
            raise wire.NodeUnavailable(f"the node service at {self.path} did not take "
                                       f"{verb.name}: {exc}") from None
        while True:
            try:
                got = sock.recv(deadline)
            except OSError as exc:  # TimeoutError among them
                self._gave_up = [*self._gave_up, call_id][-wire.MAX_GAVE_UP:]
                self.reset()
                why = (f"did not answer {verb.name} within "
                       f"{self.timeout_ms + int(wait_s * 1000)} ms"
                       if isinstance(exc, TimeoutError) else
                       f"closed the connection before it answered {verb.name} ({exc})")
                raise wire.NodeUnavailable(f"the node service at {self.path} {why}"
                                           ) from None
            try:
                reply = wire.decode_reply(got)
            except wire.FrameError:
                continue  # not an answer (the service never sends one): not ours
            if reply.call_id != call_id and not (
                    reply.call_id is None and wire.OTHER_VERSION in reply.error):
                continue  # a late answer to an earlier call
            self._gave_up = []  # the service read them with this call
            if not reply.ok:
                raise wire.NodeRefused(reply.error)
            try:
                return verb.decode_reply(reply.value)
            except wire.FrameError as exc:
                raise wire.NodeRefused(f"the answer to {verb.name} is not its type: "
                                       f"{exc}") from None

    def call_as(self, client_id: str, attach_again: Callable[[], str], verb: Verb,
                *args: Any, wait_s: float = 0.0, **kwargs: Any) -> Any:
        """``call`` as the attached client ``client_id``. When the service no longer
        knows it (its lease ended while it was idle, or the service restarted), what
        it held there is void: ``attach_again()`` attaches anew and gives the new id
        (or raises ``NodeUnavailable``), and the call is made once more; so too when it
        refuses this connection as ``client_id``'s (a socket renewed where the service
        cannot tell its process). Forgotten twice is ``NodeUnavailable``."""
        for again in (False, True):
            try:
                return self.call(verb, client_id, *args, wait_s=wait_s, **kwargs)
            except wire.NodeRefused as exc:
                if not (wire.UNKNOWN_ENGINE in str(exc)
                        or wire.FOREIGN_CLIENT in str(exc)):
                    raise
                if again:
                    raise wire.NodeUnavailable(str(exc)) from None
            client_id = attach_again()
        raise AssertionError("unreachable")

    def reset(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def close(self) -> None:
        self.reset()


def worker_root(node: str, timeout_s: float, rank: int, geometry: KVGeometry,
                ranks: TensorRanks, wait_s: float = 60.0, group: str = "") -> WorkerRoot:
    """A worker's store directory and arena, from the service (waits up to ``wait_s``
    for it to come up: a worker cannot run without its files)."""
    client = NodeClient(node, timeout_s, group)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                root: WorkerRoot = client.call(verbs.WORKER, "", rank, geometry, ranks)
                return root
            except wire.NodeUnavailable as exc:
                if isinstance(exc, trust.NodeUntrusted) or time.monotonic() >= deadline:
                    raise ValueError(f"store.node={node!r}: no node service answers at "
                                     f"{client.path} (start it with `flatcake serve`): "
                                     f"{exc}") from None
                time.sleep(0.5)
    finally:
        client.close()
