"""A store's membership in the cluster: the index, its NIXL agents, and one thread.

``ClusterService`` is what ``FlatCakeStore`` holds when ``store.cluster_url`` is set:

* it joins the cluster index (``ClusterIndex``) as ``store.node_id`` under a new epoch;
* a *serving* agent (``fc-node-{node}-{epoch}``) registers the store's host arena, so
  peers READ memory segments from it, and answers their staged SSD requests from the
  store's session files (``StagingServer``); ``windows`` *client* agents
  (``fc-client-{node}-{epoch}-{k}``) each hold one receive window of this node's own
  remote reads, a pool (``cio.remote_readers.NixlPeers``): up to ``windows`` reads run
  at once. Separate agents, so the server's notifications and each client's never mix,
  and no agent is used by two threads at once. All are published in the index for this
  epoch (the clients under roles ``client0``, ``client1``, ...);
* one thread (``flatcake-cluster``) publishes and removes index entries in the order the
  store queued them (publish after a segment is durable, remove when the books drop it:
  never out of order, never under the store's lock; they wait in one bounded queue,
  ``cluster.writer.IndexWriter``, for the join and while Redis fails, and are sent in
  order once it answers), serves staging requests and renews the lease.

A node of several tensor-parallel parts (the node service, heads split over the ranks:
each part has its own arena and session files) passes the parts after the first in
``parts``: each gets its own serving agent and staging server, published under role
``part{p}`` (``part_role``); a requester's rank reads its part through that agent.

Lookups (``lookup``) run on the caller's thread: one batched round trip set per call.
A Redis or NIXL failure is a miss or a publish that waits, never a crash of the store.

Redis unreachable at start-up (``background_join``, what every store host gets): the
service logs one warning, serves local-only (lookups miss, no remote readers) and the
thread retries the join with back-off (``join_backoff_s``: first and longest wait).
Meanwhile what the store publishes waits in the writer (a removal cancels its publish:
nothing of this life reached Redis, and entries of an older epoch are ignored by every
lookup); once joined the writer sends it first, in order. ``background_join=False``
raises ``ClusterUnavailableError`` instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from flatcake.cio.remote import NixlNode
from flatcake.cio.remote_load import RemoteReader
from flatcake.cio.remote_readers import NixlPeers, remote_reader
from flatcake.cio.remote_ssd import StagingServer
from flatcake.cluster.index import ClusterIndex, RemoteHit, StaleNodeError
from flatcake.cluster.writer import IndexWriter
from flatcake.control.address import Medium
from flatcake.errors import ClusterUnavailableError

logger = logging.getLogger(__name__)

Published = tuple[int, Sequence[bytes], Sequence[int], Mapping[str, Any]]
Part = tuple[np.ndarray, Callable[[str], "str | None"]]  # its arena, its file resolver
_IDLE_S = 0.002


def part_role(part: int) -> str:
    """The index role of the serving agent of tensor-parallel part ``part`` ("" = the
    node's own agent, part 0)."""
    return "" if part == 0 else f"part{part}"


def _servable(arena: np.ndarray) -> np.ndarray:
    """What a serving agent registers: the arena, or a page when there is nothing in
    memory to serve (NIXL registers no empty region)."""
    return arena if arena.nbytes else np.zeros(4096, np.uint8)


class ClusterService:
    """One store's cluster membership (see the module docstring)."""

    def __init__(self, url: str, node: int, arena: np.ndarray,
                 files: Callable[[str], str | None], *, cluster: str = "flatcake",
                 window_bytes: int = 64 << 20, windows: int = 3,
                 stage_bytes: int = 16 << 20, timeout_s: float = 5.0,
                 lease_ms: int = 10_000, progress_thread: bool = False,
                 background_join: bool = True,
                 join_backoff_s: tuple[float, float] = (0.5, 30.0),
                 parts: Sequence[Part] = ()) -> None:
        if not isinstance(windows, int) or windows < 1:
            raise ValueError(f"windows must be an int >= 1, got {windows!r}")
        if join_backoff_s[0] <= 0 or join_backoff_s[1] < join_backoff_s[0]:
            raise ValueError(f"join_backoff_s must be (first > 0, longest >= first), got "
                             f"{join_backoff_s!r}")
        self.index = ClusterIndex(url, node, cluster=cluster, lease_ms=lease_ms,
                                  timeout_s=min(timeout_s, 2.0))
        self._arena, self._files = arena, files
        self._parts = list(parts)
        self.part_servers: list[tuple[NixlNode, StagingServer]] = []
        self._agent_args = (windows, window_bytes, stage_bytes, progress_thread)
        self._timeout_s = timeout_s
        self.server: NixlNode | None = None
        self.clients: list[NixlNode] = []
        self.staging: StagingServer | None = None
        self.peers: NixlPeers | None = None
        self._joining = threading.Condition()
        self._joined = False  # under _joining
        self._stop = threading.Event()
        self._renewed = time.monotonic()
        self._backoff = join_backoff_s
        # Entries wait for the join and for Redis; retried at most every 5 s (sooner at first).
        self.writer = IndexWriter(self.index,
                                  retry_s=(join_backoff_s[0], max(join_backoff_s[0], 5.0)))
        try:
            self._join()
        except ClusterUnavailableError as exc:
            if not background_join:
                self.index.close()
                raise
            logger.warning("%s; node %d serves local-only and joins the cluster in the "
                           "background", exc, node)
        except BaseException:
            self.index.close()
            raise
        self._thread = threading.Thread(target=self._loop, name="flatcake-cluster",
                                        daemon=True)
        self._thread.start()

    def _join(self) -> None:
        """Join the index, start the agents, publish them; then publish what was held."""
        windows, window_bytes, stage_bytes, progress_thread = self._agent_args
        node, arena = self.node, self._arena
        try:
            epoch = self.index.join()
            self.server = NixlNode(f"fc-node-{node}-{epoch}", _servable(arena), 4096,
                                   progress_thread=progress_thread)
            for k in range(windows):
                self.clients.append(NixlNode(f"fc-client-{node}-{epoch}-{k}",
                                             np.zeros(4096, np.uint8), window_bytes))
            self.staging = StagingServer(self.server, self._files, self._resolve,
                                         stage_bytes)
            for p, (part_arena, part_files) in enumerate(self._parts, start=1):
                server = NixlNode(f"fc-part{p}-{node}-{epoch}", _servable(part_arena), 4096,
                                  progress_thread=progress_thread)
                self.part_servers.append((server, StagingServer(
                    server, part_files, self._resolve, stage_bytes)))
            ok = self.index.publish_agent(self.server.metadata(), self.server.record()) \
                and all(self.index.publish_agent(c.metadata(), c.record(), role=f"client{k}")
                        for k, c in enumerate(self.clients)) \
                and all(self.index.publish_agent(sv.metadata(), sv.record(),
                                                 role=part_role(p))
                        for p, (sv, _) in enumerate(self.part_servers, start=1))
            if not ok:
                raise ClusterUnavailableError(f"cannot publish node {node}'s agents in the "
                                              f"cluster index at {self.index.url}")
        except BaseException:
            self._close_agents()
            raise
        peers = NixlPeers(self.clients, self.index.agent, self._timeout_s)
        peers.on_retired = self._republish_client
        self.peers = peers
        self._renewed = time.monotonic()
        with self._joining:
            self._joined = True
            self._joining.notify_all()

    @property
    def joined(self) -> bool:
        """Whether this node is in the cluster (else local-only, joining in the back)."""
        return self._joined

    def wait_joined(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the join; whether the node joined."""
        with self._joining:
            self._joining.wait_for(lambda: self._joined or self._stop.is_set(), timeout_s)
            return self._joined

    @property
    def published(self) -> int:
        """Segments Redis took a publish of (stats and tests)."""
        return self.writer.published

    @property
    def removed(self) -> int:
        """Segments Redis took a removal of."""
        return self.writer.removed

    @property
    def node(self) -> int:
        return self.index.node

    @property
    def epoch(self) -> int:
        return self.index.epoch

    # -- index entries (queued, applied in order by the thread) --------------------------
    def publish(self, segments: Sequence[Published]) -> None:
        """Queue durable segments ``(segment_id, keys, block addresses, record)``."""
        if segments:
            self.writer.put("publish", segments)

    def remove(self, segments: Sequence[tuple[int, Sequence[bytes]]]) -> None:
        """Queue the removal of dropped segments ``(segment_id, keys)``."""
        if segments:
            self.writer.put("remove", segments)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every queued publish and removal reached Redis, or Redis failed and
        they wait in ``writer``; before the join at once (they wait for it)."""
        return not self._joined or self.writer.wait(timeout_s)

    # -- lookups and readers -----------------------------------------------------------
    def lookup(self, keys: Sequence[bytes]) -> list[RemoteHit]:
        """The prefix of ``keys`` other live nodes hold (batched; a failure or not
        joined yet = [])."""
        if not self._joined:
            return []
        return self.index.lookup(keys, prefix=True)

    def reader(self, medium: Medium, node: int) -> RemoteReader | None:
        """The remote reader of ``node``'s ``medium`` (the executor dispatch's source)."""
        if node == self.node or self.peers is None:
            return None
        return remote_reader(self.peers, medium, node)

    # -- the thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        wait = self._backoff[0]
        while not self._joined:
            if self._stop.wait(wait):
                return
            try:
                self._join()
                logger.info("node %d joined the cluster index at %s (epoch %d)", self.node,
                            self.index.url, self.epoch)
            except ClusterUnavailableError as exc:
                wait = min(wait * 2, self._backoff[1])
                logger.debug("node %d: join failed (%s); next try in %.1f s", self.node,
                             exc, wait)
            except Exception as exc:
                logger.error("node %d cannot join the cluster: %s; it stays local-only",
                             self.node, exc)
                return
        while not self._stop.is_set():
            busy = self.writer.apply()
            try:
                if self.staging is not None and self.staging.serve_once():
                    busy = True
                for _server, staging in self.part_servers:
                    busy = bool(staging.serve_once()) or busy
                if time.monotonic() - self._renewed > self.index.lease_ms / 3000:
                    self.index.renew()
                    self._renewed = time.monotonic()
            except StaleNodeError:
                logger.error("node %d: a newer process took this node id; this one stops "
                             "serving the cluster", self.node)
                self.writer.close()  # flush waits no longer
                return
            except Exception as exc:  # redis or NIXL trouble: keep serving locally
                logger.warning("cluster service of node %d: %s", self.node, exc)
            if not busy:
                time.sleep(_IDLE_S)

    def _republish_client(self, k: int) -> None:
        """A timed-out read retired client ``k``'s window: owners must WRITE into the
        new one, so its metadata is published again (they load it on the next request)."""
        client = self.clients[k]
        if not self.index.publish_agent(client.metadata(), client.record(),
                                        role=f"client{k}"):
            logger.warning("node %d: client %d's new metadata is not published; staged "
                           "SSD reads into it fail until it is", self.node, k)

    def _resolve(self, agent_name: str) -> bytes | None:
        """A requester's client agent metadata (only its live epoch's)."""
        parts = agent_name.split("-")
        if len(parts) != 5 or parts[1] != "client" or not (parts[2].isdigit()
                                                            and parts[4].isdigit()):
            return None
        found = self.index.agent(int(parts[2]), role=f"client{int(parts[4])}")
        return None if found is None or found[1]["agent"] != agent_name else found[0]

    # -- lifecycle ----------------------------------------------------------------------
    def close(self) -> None:
        """Apply the queued entries, leave the index (peers see this node gone at once),
        stop the thread, release the agents."""
        self.flush()
        self._stop.set()
        with self._joining:
            self._joining.notify_all()  # wait_joined gives up
        self._thread.join(timeout=10)
        try:
            self.index.leave()
        except Exception as exc:
            logger.warning("node %d could not leave the cluster index: %s", self.node, exc)
        self._close_agents()
        self.index.close()

    def _close_agents(self) -> None:
        for part in (self.staging, *self.clients, self.server,
                     *(x for pair in self.part_servers for x in reversed(pair))):
            if part is not None:
                try:
                    part.close()
                except Exception as exc:
                    logger.warning("closing a NIXL agent part: %s", exc)
        self.staging, self.clients, self.server = None, [], None
        self.part_servers = []
