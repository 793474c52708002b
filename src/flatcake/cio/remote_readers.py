"""The NIXL-backed remote readers of the executor's ``(medium, node)`` dispatch.

``NixlPeers`` is this node's *client* agent (a ``NixlNode`` whose receive window takes
every remote read of the process, one at a time) and the way to another node's serving
agent (``agent_of(node)``: its NIXL metadata and record, from the cluster index; None
when the node is gone). Per (medium, node) the dispatch gets a small reader bound to it:

    RemoteMemoryReader  one NIXL READ of the wanted layers from the owner's registered
                        arena (layer ``l`` of a segment is ``layout.layer_bytes`` at
                        ``offset + layout.layer_offset(l)``)
    RemoteSsdReader     the owner stages the layers from its session file and WRITEs
                        them into the window, one part per layer
                        (``cio.remote_ssd.fetch``); each layer is checked as soon as
                        it landed, while the owner stages the next

Both are bounded by ``timeout_s`` (a dead or slow owner is a miss) and hand the bytes to
the caller's check (``cio.remote_load``) while the window is held.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from flatcake.cio.remote import NixlNode
from flatcake.cio.remote_load import Consume
from flatcake.cio.remote_ssd import fetch
from flatcake.control.address import Address
from flatcake.plan.remote import RemoteRun

AgentOf = Callable[[int], "tuple[bytes, dict[str, Any]] | None"]


class NixlPeers:
    """This node's client agent and its way to other nodes' serving agents."""

    def __init__(self, client: NixlNode, agent_of: AgentOf, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        self.client = client
        self.agent_of = agent_of
        self.timeout_s = timeout_s
        self.lock = threading.Lock()  # one read in the window at a time
        # Called (under ``lock``) when a timed-out read retired the window: the owners
        # must load the client's new metadata (the cluster service re-publishes it).
        self.on_retired: Callable[[], None] | None = None
        self._generation = client.generation

    def retired(self) -> None:
        """Tell ``on_retired`` once per window the last read retired (under ``lock``)."""
        if self.client.generation != self._generation:
            self._generation = self.client.generation
            if self.on_retired is not None:
                self.on_retired()

    def peer(self, node: int) -> tuple[str, dict[str, Any]] | None:
        """(agent name, record) of ``node``'s live serving agent; None = a miss."""
        found = self.agent_of(node)
        if found is None:
            return None
        name = self.client.connect(found[0])
        return None if name is None else (name, found[1])


class _Bound:
    def __init__(self, peers: NixlPeers, node: int) -> None:
        self.peers = peers
        self.node = node

    @property
    def window_bytes(self) -> int:
        return int(self.peers.client.window.nbytes)

    def read_layers(self, run: RemoteRun, layers: range, consume: Consume) -> bool:
        if not layers:
            return True
        with self.peers.lock:
            found = self.peers.peer(self.node)
            try:
                return found is not None and self._read(found, run, layers, consume)
            finally:
                self.peers.retired()

    def _read(self, found: tuple[str, dict[str, Any]], run: RemoteRun, layers: range,
              consume: Consume) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        """The client agent belongs to the cluster service, which closes it."""


class RemoteMemoryReader(_Bound):
    """Layers of a segment in ``node``'s host arena, by NIXL READ."""

    def _read(self, found: tuple[str, dict[str, Any]], run: RemoteRun, layers: range,
              consume: Consume) -> bool:
        base = Address.decode(run.address).offset
        n = run.layout.layer_bytes
        got = self.peers.client.read(found[0], found[1],
                                     [(base + run.layout.layer_offset(x), n) for x in layers],
                                     timeout_s=self.peers.timeout_s)
        return got is not None and all(consume(layer, got[i * n:(i + 1) * n])
                                       for i, layer in enumerate(layers))


class RemoteSsdReader(_Bound):
    """Layers of a segment in one of ``node``'s session files, staged by the owner."""

    def _read(self, found: tuple[str, dict[str, Any]], run: RemoteRun, layers: range,
              consume: Consume) -> bool:
        # One part per layer: a layer is checked and scattered while the next is staged.
        parts = [[(run.location, run.file_offset + run.layout.layer_offset(layer),
                   run.layout.layer_bytes)] for layer in layers]
        got = fetch(self.peers.client, found[0], parts, timeout_s=self.peers.timeout_s,
                    on_part=lambda i, view: consume(layers[i], view))
        return got is not None
