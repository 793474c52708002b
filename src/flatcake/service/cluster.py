"""The node service as its node's member of the cluster index (``store.cluster_url`` in
the service's configuration).

One member per machine, whatever the engines attached to it (``store.node_id`` names
the machine): the service joins the index (``cluster.service.ClusterService``), serves
remote reads of its sessions from its shared arenas and session files (part 0 through
the node's own agent, each further tensor-parallel part through its own, role
``part{p}``), publishes what its books publish and removes what they drop::

    books made     every SSD segment recovered, with each part's crcs from its header
                   (``cio.scan``), published under the new epoch
    store          every worker reported it durable; each writing rank's report
                   carries its part's crcs (``StoreDone.crcs``, computed by the worker
                   from the bytes it wrote) -> one entry per block, one record with
                   every part's crcs (``plan.remote.segment_record``)
    reclaim        the books dropped segments -> their entries removed
    lookup         the engines' scheduler halves hosted here look up after their local
                   prefix through this member's index (``connectors.cluster_side``), on
                   the member's lookup thread: the service's loop waits for it at most
                   ``LOOKUP_WAIT_S``, and not at all while Redis still owes an earlier
                   answer; either is a miss (a failure: the scheduler half goes
                   local-only for a while), so a hanging Redis never stalls the engines

The service never moves a KV byte for its engines; remote reads of its sessions are
served by its NIXL agents from the arenas it maps and the files it holds, as an
embedded store serves them. The workers of attached engines read other nodes' blocks
themselves (``cluster.readers``), straight into their paged KV, each its own part.
"""

from __future__ import annotations

import logging
import mmap
import os
import queue
import threading
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from flatcake.cio.executor import Executor
from flatcake.config import FlatCakeConfig
from flatcake.connectors.cluster_side import Index
from flatcake.control import ControlPlane
from flatcake.control.address import Medium
from flatcake.control.index import Segment
from flatcake.geometry import KVGeometry
from flatcake.plan.remote import IndexHit
from flatcake.plan.tasks import StoreDone
from flatcake.store.cluster import published, segment_crcs, session_file

if TYPE_CHECKING:
    from flatcake.cluster.service import Published

logger = logging.getLogger("flatcake.service")


LOOKUP_WAIT_S = 0.25  # the longest a lookup holds the service's loop (a few round trips)


class BoundedLookup:
    """Cluster lookups on a thread of their own, each waited for at most ``wait_s``: an
    answer later than that, or asked while an earlier one is still owed, is a miss and
    counts in ``failures`` (the scheduler halves' ``Index``; closed by the member).
    Once Redis was late or failed, a lookup is not waited for at all (a miss at once,
    asked only to probe Redis) until Redis answers one again."""

    def __init__(self, lookup: Callable[[Sequence[bytes]], Sequence[IndexHit]],
                 failures: Callable[[], int], wait_s: float = LOOKUP_WAIT_S) -> None:
        if wait_s <= 0:
            raise ValueError(f"wait_s must be positive, got {wait_s!r}")
        self._lookup, self._failures, self.wait_s = lookup, failures, wait_s
        self._asks: queue.SimpleQueue[_Ask | None] = queue.SimpleQueue()
        self._owed = threading.Event()  # a lookup is on the thread
        self._answering = True  # Redis answered the last lookup (else none is waited for)
        self.missed = 0  # lookups answered as misses, Redis too slow
        self._thread = threading.Thread(target=self._serve, name="flatcake-cluster-lookup",
                                        daemon=True)
        self._thread.start()

    @property
    def failures(self) -> int:
        return self._failures() + self.missed

    @property
    def owed(self) -> bool:
        """Whether a lookup is still on the thread (Redis owes its answer)."""
        return self._owed.is_set()

    def lookup(self, keys: Sequence[bytes], *, prefix: bool = True) -> Sequence[IndexHit]:
        if self._owed.is_set():  # Redis still owes the last answer: don't queue behind it
            self.missed += 1
            return []
        ask = _Ask(keys)
        self._owed.set()
        self._asks.put(ask)
        if not self._answering:  # Redis was late or failed: this ask only probes it
            self.missed += 1
            return []
        if ask.done.wait(self.wait_s):
            return ask.hits
        self._answering = False
        self.missed += 1
        logger.warning("the cluster index did not answer a lookup within %.2f s; a miss",
                       self.wait_s)
        return []

    def _serve(self) -> None:
        while (ask := self._asks.get()) is not None:
            failures = self._failures()
            try:
                ask.hits = list(self._lookup(ask.keys))
                self._answering = self._failures() == failures
            except Exception as exc:  # a miss, never an exception into an engine
                logger.warning("cluster index lookup failed: %s", exc)
                self.missed += 1
                self._answering = False
            self._owed.clear()
            ask.done.set()

    def close(self) -> None:
        """Stop the thread (it leaves once Redis answers what it owes)."""
        self._asks.put(None)


class _Ask:
    def __init__(self, keys: Sequence[bytes]) -> None:
        self.keys, self.hits = keys, list[IndexHit]()
        self.done = threading.Event()


class _MemberIndex:
    """The member's lookups as a scheduler half reads them (closed by the member)."""

    def __init__(self, lookups: BoundedLookup) -> None:
        self._lookups = lookups

    @property
    def failures(self) -> int:
        return self._lookups.failures

    def lookup(self, keys: Sequence[bytes], *, prefix: bool = True) -> Sequence[IndexHit]:
        return self._lookups.lookup(keys, prefix=prefix)

    def close(self) -> None:
        """The member closes the lookups."""


def _map_arena(path: Path, capacity: int) -> np.ndarray:
    """The shared arena file of one part, mapped (the bytes peers READ); unmapped when
    the array goes."""
    if capacity == 0:
        return np.zeros(0, np.uint8)
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        mapped = mmap.mmap(fd, capacity, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    return np.frombuffer(mapped, np.uint8)


class NodeCluster:
    """The node service's membership of the cluster (see the module docstring).

    Args:
        config: the service's configuration (``store.cluster_url`` set).
        roots: each part's executor (its session files, recovered; its crc book).
        arenas: each part's shared arena file.
    """

    def __init__(self, config: FlatCakeConfig, roots: Sequence[Executor],
                 arenas: Sequence[Path]) -> None:
        from flatcake.cio.remote import nixl_available
        from flatcake.cluster.service import ClusterService

        why = nixl_available()
        if why:
            raise ValueError(f"store.cluster_url is set but the node service cannot serve "
                             f"remote reads in this interpreter: {why}")
        store = config.store
        self.roots = list(roots)
        self._maps = [_map_arena(p, store.memory_capacity_bytes) for p in arenas]
        files = [partial(session_file, ex.files.sessions_dir) for ex in self.roots]
        parts = list(zip(self._maps, files, strict=True))
        # The service reads nothing remote itself: one small window for the protocol.
        self.service = ClusterService(
            store.cluster_url, store.node_id, parts[0][0], parts[0][1],
            cluster=store.cluster_name, window_bytes=4096, windows=1,
            timeout_s=store.remote_timeout_s, parts=parts[1:])
        self.skipped = 0  # stores not published (a part's crcs missing)
        index = self.service.index
        self.lookups = BoundedLookup(self.service.lookup, lambda: index.failures)

    @property
    def parts(self) -> int:
        return len(self.roots)

    def lookup_index(self) -> Index:
        return _MemberIndex(self.lookups)

    def republish(self, control: ControlPlane) -> None:
        """After recovery: every SSD segment the books kept, with each part's crcs."""
        entries = []
        for seg in control.segments():
            if seg.medium != Medium.SSD:
                continue
            crcs = [segment_crcs(ex, seg) for ex in self.roots]
            if all(c is not None for c in crcs):
                entries.append(self._entry(seg, crcs))  # type: ignore[arg-type]
        self.service.publish(entries)

    def publish(self, segment: Segment, reports: Sequence[StoreDone]) -> None:
        by_part = {r.part: r.crcs for r in reports if r.crcs}
        crcs = [by_part.get(p) for p in range(self.parts)]
        if any(c is None for c in crcs):
            self.skipped += 1
            logger.warning("segment %d is not published in the cluster index: no crcs "
                           "reported for part(s) %s", segment.segment_id,
                           [p for p, c in enumerate(crcs) if c is None])
            return
        self.service.publish([self._entry(segment, crcs)])  # type: ignore[arg-type]

    @staticmethod
    def _entry(seg: Segment, crcs: Sequence[Sequence[int]]) -> Published:
        return published(seg, crcs[0], crcs if len(crcs) > 1 else ())

    def remove(self, segments: Sequence[tuple[int, Sequence[bytes]]]) -> None:
        self.service.remove(list(segments))

    def close(self) -> None:
        """Publish what is queued, leave the index, release the agents and the maps."""
        self.lookups.close()
        self.service.close()
        self._maps = []


def join_cluster(config: FlatCakeConfig, geometry: KVGeometry, roots: Sequence[Executor],
                 arenas: Sequence[Path], control: ControlPlane) -> NodeCluster:
    """The service as its node's member, what its books recovered published; a
    refusal (``NodeRefused``) names what it cannot serve."""
    from flatcake.link.wire import NodeRefused

    if geometry.layer_window_blocks:
        raise NodeRefused(f"store.cluster_url is set, but geometry {geometry.name!r} has "
                          "sliding-window layers, which remote reads do not serve yet")
    try:
        member = NodeCluster(config, roots, arenas)
    except (ValueError, RuntimeError) as exc:
        raise NodeRefused(str(exc)) from None
    member.republish(control)
    logger.info("node %d of cluster %r at %s (%d tensor-parallel part(s))",
                config.store.node_id, config.store.cluster_name,
                member.service.index.url, member.parts)
    return member


STORES_IN_CLUSTER = (
    "this node service is in a cluster (store.cluster_url): an attached FlatCakeStore "
    "(and the SGLang backend) cannot share it yet, as the service would not publish its "
    "writes; open the store embedded with its own root and store.cluster_url, or attach "
    "vLLM engines only")


def same_cluster(engine: FlatCakeConfig, service: FlatCakeConfig) -> None:
    """Refuse an engine whose configuration names a cluster other than the service's
    (the service's ``store.cluster_url`` / ``cluster_name`` / ``node_id`` apply)."""
    from flatcake.link.wire import NodeRefused

    asked, mine = engine.store, service.store
    if asked.cluster_url and (asked.cluster_url, asked.cluster_name, asked.node_id) != (
            mine.cluster_url, mine.cluster_name, mine.node_id):
        where = (f"node {mine.node_id} of cluster {mine.cluster_name!r} at "
                 f"{mine.cluster_url}" if mine.cluster_url else "in no cluster")
        raise NodeRefused(
            f"the engine asks for cluster {asked.cluster_name!r} at {asked.cluster_url} "
            f"as node {asked.node_id}; this node service is {where}: the service's "
            "store.cluster_url, cluster_name and node_id apply, leave them out of the "
            "engine's configuration")
