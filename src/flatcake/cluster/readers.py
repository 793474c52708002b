"""The remote reads of a worker attached to a node service in a cluster.

The node service is the node's member of the cluster index (``service.cluster``): it
joins, serves its arenas and session files, publishes and removes. An attached worker
only reads: it holds its own client agents (receive windows, ``cio.remote_readers``)
and reads the part of each remote segment its rank holds, through the owner's serving
agent of that part (``cluster.service.part_role``). Owners stage SSD reads by WRITING
into a requester's window, so they look its client agents up in the index: the worker
publishes them under its node's live epoch (the service's), checked again at most every
``recheck_s`` when it reads, so a restarted service's new epoch is followed. Its client
slots (roles ``client{k}``) carry a random tag, unique among the node's workers.

A Redis or NIXL failure is a miss, never a crash: the load reports those blocks as load
errors and the engine recomputes them.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Any

import numpy as np

from flatcake.cio.remote import NixlNode
from flatcake.cio.remote_load import RemoteReader
from flatcake.cio.remote_readers import NixlPeers, remote_reader
from flatcake.cluster.index import ClusterIndex
from flatcake.cluster.service import part_role
from flatcake.config import FlatCakeConfig
from flatcake.control.address import Medium

logger = logging.getLogger(__name__)


class ClusterReaders:
    """Remote readers of tensor-parallel part ``part`` for a worker of the node
    ``config.store.node_id`` (see the module docstring)."""

    def __init__(self, config: FlatCakeConfig, part: int, *, recheck_s: float = 1.0) -> None:
        store = config.store
        self.index = ClusterIndex(store.cluster_url, store.node_id, cluster=store.cluster_name,
                                  timeout_s=min(store.remote_timeout_s, 2.0))
        self.part = part
        self.recheck_s = recheck_s
        self._lock = threading.Lock()
        self._checked = float("-inf")
        self._epoch = 0  # the epoch the clients are published under (0: not yet)
        tag = secrets.randbelow(10**8) * 100  # + k < 64: unique slots among the workers
        self.slots = [tag + k for k in range(store.remote_windows)]
        first = self._live_epoch() or 0
        self.clients: list[NixlNode] = []
        try:
            for slot in self.slots:
                self.clients.append(NixlNode(f"fc-client-{store.node_id}-{first}-{slot}",
                                             np.zeros(4096, np.uint8),
                                             store.remote_window_bytes))
        except BaseException:
            self.close()
            raise
        self.peers = NixlPeers(self.clients, self._agent_of, store.remote_timeout_s)
        self.peers.on_retired = self._republish

    def _live_epoch(self) -> int | None:
        try:
            return self.index.live_epochs([self.index.node]).get(self.index.node)
        except Exception as exc:  # redis errors: not now
            logger.warning("cluster index: cannot read node %d's epoch: %s",
                           self.index.node, exc)
            return None

    def _agent_of(self, node: int) -> tuple[bytes, dict[str, Any]] | None:
        self._publish_clients()
        return self.index.agent(node, role=part_role(self.part))

    def _publish_clients(self, force: bool = False) -> None:
        """Publish the client agents under the node's live epoch when it changed
        (checked at most every ``recheck_s``)."""
        with self._lock:
            now = time.monotonic()
            if not force and now - self._checked < self.recheck_s:
                return
            self._checked = now
            live = self._live_epoch()
            if live is None or (live == self._epoch and not force):
                return
            self.index.epoch = live  # this node's life, the service's: publish as it
            ok = all(self.index.publish_agent(c.metadata(), c.record(), role=f"client{s}")
                     for c, s in zip(self.clients, self.slots, strict=True))
            self._epoch = live if ok else 0

    def _republish(self, k: int) -> None:
        """A timed-out read retired client ``k``'s window: owners must load its new
        metadata."""
        self._publish_clients(force=True)

    def reader(self, medium: Medium, node: int) -> RemoteReader | None:
        """The executor dispatch's remote source."""
        if node == self.index.node:
            return None
        return remote_reader(self.peers, medium, node)

    def close(self) -> None:
        for client in self.clients:
            try:
                client.close()
            except Exception as exc:
                logger.warning("closing a NIXL client agent: %s", exc)
        self.clients = []
        self.index.close()
