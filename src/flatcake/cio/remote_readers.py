"""The NIXL-backed remote readers of the executor's ``(medium, node)`` dispatch.

``NixlPeers`` is this node's pool of *client* agents and the way to another node's
serving agent (``agent_of(node)``: its NIXL metadata and record, from the cluster index;
None when the node is gone). Each client is a ``NixlNode`` with its own registered
receive window; a read leases one client for its duration, so up to ``len(clients)``
remote reads run at once (two restores from two owners, two sessions from one owner)
and each client is used by one thread at a time (its notifications, its transfers).
A read that finds every client busy waits for one at most ``timeout_s``, then is a miss.
Per (medium, node) the dispatch gets a small reader bound to the pool:

    RemoteMemoryReader  one NIXL READ of the wanted layers from the owner's registered
                        arena (layer ``l`` of a segment is ``layout.layer_bytes`` at
                        ``offset + layout.layer_offset(l)``)
    RemoteSsdReader     the owner stages the layers from its session file and WRITEs
                        them into the leased window, one part per layer
                        (``cio.remote_ssd.fetch``); each layer is checked as soon as
                        it landed, while the owner stages the next

Both are bounded by ``timeout_s`` (a dead or slow owner is a miss) and hand the bytes to
the caller's check (``cio.remote_load``) while the window is leased.

**Retired windows.** A read that timed out may still land later, so its window is never
reused nor freed (``NixlNode.retire_window``): the client gets a new window and
``on_retired(k)`` tells the owners its new metadata. The pool renews at most
``len(clients)`` windows in all (``spare_windows``), so its memory stays under twice the
windows' bytes; once they are spent, a client whose window is retired leaves the pool
(its windows are kept until close) and the others go on serving.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from flatcake.cio.remote import NixlNode
from flatcake.cio.remote_load import Consume
from flatcake.cio.remote_ssd import fetch
from flatcake.control.address import Address, Medium
from flatcake.plan.remote import RemoteRun

logger = logging.getLogger(__name__)

AgentOf = Callable[[int], "tuple[bytes, dict[str, Any]] | None"]


class NixlPeers:
    """This node's client agents (a pool) and its way to other nodes' serving agents."""

    def __init__(self, clients: Sequence[NixlNode], agent_of: AgentOf,
                 timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        if not clients:
            raise ValueError("remote reads need at least one client agent")
        sizes = {int(c.window.nbytes) for c in clients}
        if len(sizes) != 1:
            raise ValueError(f"the client windows differ in size: {sorted(sizes)}")
        self.clients = list(clients)
        self.window_bytes = sizes.pop()
        self.agent_of = agent_of
        self.timeout_s = timeout_s
        # Called with a client's index when a timed-out read retired its window: the
        # owners must load that client's new metadata (the cluster service publishes it).
        self.on_retired: Callable[[int], None] | None = None
        self.spare_windows = len(self.clients)
        self._spares_lock = threading.Lock()
        self._free: queue.Queue[int] = queue.Queue()
        self._generations = [c.generation for c in self.clients]
        for k, client in enumerate(self.clients):
            client.renew = self._renew
            self._free.put(k)

    def _renew(self) -> bool:
        with self._spares_lock:
            if self.spare_windows <= 0:
                return False
            self.spare_windows -= 1
            return True

    @property
    def in_service(self) -> int:
        """Clients that still have a window."""
        return sum(1 for c in self.clients if c.window.nbytes)

    @contextmanager
    def lease(self) -> Iterator[tuple[int, NixlNode] | None]:
        """A free client ``(index, agent)`` for one read, or None after ``timeout_s``
        without one (a miss). On return, a retired window is reported (``on_retired``)
        and a client left without a window stays out of the pool."""
        try:
            k = self._free.get(timeout=self.timeout_s)
        except queue.Empty:
            logger.warning("no free remote receive window within %.1fs: a miss",
                           self.timeout_s)
            yield None
            return
        client = self.clients[k]
        try:
            yield k, client
        finally:
            if client.generation != self._generations[k]:
                self._generations[k] = client.generation
                if client.window.nbytes and self.on_retired is not None:
                    self.on_retired(k)
            if client.window.nbytes:
                self._free.put(k)
            else:
                logger.error("remote client %s retired its last window (the pool renews "
                             "%d in all): %d of %d clients left", client.name,
                             len(self.clients), self.in_service, len(self.clients))

    def peer(self, client: NixlNode, node: int) -> tuple[str, dict[str, Any]] | None:
        """(agent name, record) of ``node``'s live serving agent as ``client`` knows it;
        None = a miss."""
        found = self.agent_of(node)
        if found is None:
            return None
        name = client.connect(found[0])
        return None if name is None else (name, found[1])


class _Bound:
    def __init__(self, peers: NixlPeers, node: int) -> None:
        self.peers = peers
        self.node = node

    @property
    def window_bytes(self) -> int:
        return self.peers.window_bytes

    def read_layers(self, run: RemoteRun, layers: range, consume: Consume) -> bool:
        if not layers:
            return True
        with self.peers.lease() as leased:
            if leased is None:
                return False
            client = leased[1]
            found = self.peers.peer(client, self.node)
            return found is not None and self._read(client, found, run, layers, consume)

    def _read(self, client: NixlNode, found: tuple[str, dict[str, Any]], run: RemoteRun,
              layers: range, consume: Consume) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        """The client agents belong to the cluster service, which closes them."""


class RemoteMemoryReader(_Bound):
    """Layers of a segment in ``node``'s host arena, by NIXL READ."""

    def _read(self, client: NixlNode, found: tuple[str, dict[str, Any]], run: RemoteRun,
              layers: range, consume: Consume) -> bool:
        base = Address.decode(run.address).offset
        lay = run.layout
        got = client.read(found[0], found[1],
                          [(base + lay.layer_offset(x), lay.layer_bytes(x)) for x in layers],
                          timeout_s=self.peers.timeout_s)
        # The layers come back one after another in ``got``.
        at = lay.layer_offset(layers[0]) if len(layers) else 0
        return got is not None and all(
            consume(x, got[lay.layer_offset(x) - at:lay.layer_offset(x) - at
                           + lay.layer_bytes(x)]) for x in layers)


class RemoteSsdReader(_Bound):
    """Layers of a segment in one of ``node``'s session files, staged by the owner."""

    def _read(self, client: NixlNode, found: tuple[str, dict[str, Any]], run: RemoteRun,
              layers: range, consume: Consume) -> bool:
        # One part per layer: a layer is checked and scattered while the next is staged.
        parts = [[(run.location, run.file_offset + run.layout.layer_offset(layer),
                   run.layout.layer_bytes(layer))] for layer in layers]
        got = fetch(client, found[0], parts, timeout_s=self.peers.timeout_s,
                    on_part=lambda i, view: consume(layers[i], view))
        return got is not None


def remote_reader(peers: NixlPeers, medium: Medium, node: int) -> _Bound:
    """The reader of ``node``'s ``medium`` bound to ``peers``."""
    if medium == Medium.MEMORY:
        return RemoteMemoryReader(peers, node)
    return RemoteSsdReader(peers, node)
