"""The connector's scheduler half in a cluster (``store.cluster_url`` set): which blocks
after the local prefix other nodes hold, and the load task that fetches them.

Books only, like the scheduler half (no torch, no NIXL): the worker half is the node's
member of the cluster (it joins the index, serves its arena and files, publishes what it
writes); the scheduler half only reads the index. Attached to a node service, the
service is the member (``NodeMember``, ``service.cluster``): the halves it hosts look
up through its index (``member_lookup``) and hand it what to publish and remove::

    lookup       after the local prefix, or the engine's own when it is longer (and
                 the stores in flight): batched lookups of the rest of the request's
                 keys (``cluster.ClusterIndex`` as this node, so its own entries, the
                 local index's business, are skipped), in chunks of 8, 32, 128, ...
                 keys (``engine.cluster_lookup_first_keys``, then 4 times more each)
                 while every key asked was found (a miss costs one small lookup)
                 -> ``RemoteRun``s, kept for ``engine.cluster_lookup_fresh_s`` per
                 request (the engine asks again every step a request waits)
    bounded      each Redis call times out after min(store.remote_timeout_s,
                 engine.cluster_lookup_timeout_s); a failed lookup answers local-only
                 and logs one warning, and for the next
                 ``engine.cluster_lookup_retry_s`` no lookup asks Redis
    load         ``plan.requests.load``: the request's LoadTask with the remote runs
                 after its local part, an async load (the request waits), queued in
                 FC-MAS like an SSD restore (it takes a restore slot on the worker),
                 its remote blocks counted in its size (``ControlPlane.restore_request``,
                 as for every host)

A run the load cannot fetch (owner gone, read timed out, crc32 failed) ends the loaded
prefix there; the worker reports the blocks from there on as load errors and the engine
recomputes them. Nothing unverified reaches the paged KV.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from flatcake.config import FlatCakeConfig
from flatcake.control.index import Segment
from flatcake.geometry import KVGeometry
from flatcake.plan.remote import IndexHit, RemoteRun, remote_runs
from flatcake.plan.tasks import StoreDone

logger = logging.getLogger(__name__)


class Index(Protocol):
    """What the lookup reads of a cluster index (``cluster.ClusterIndex``)."""

    @property
    def failures(self) -> int:
        """Lookups that failed so far (a lookup that raised it failed)."""
        ...

    def lookup(self, keys: Sequence[bytes], *, prefix: bool = True) -> Sequence[IndexHit]:
        ...

    def close(self) -> None: ...


class NodeMember(Protocol):
    """The node service's membership of the cluster (``service.cluster.NodeCluster``)."""

    def publish(self, segment: Segment, reports: Sequence[StoreDone]) -> None:
        """A store every worker reported durable (their reports carry the crcs)."""
        ...

    def remove(self, segments: Sequence[tuple[int, Sequence[bytes]]]) -> None:
        """Segments the books dropped."""
        ...

    def lookup_index(self) -> Index:
        """The index as this node reads it (never closed by the reader)."""
        ...


@dataclass(frozen=True, slots=True)
class _Looked:
    start: int
    end: int
    at: float
    runs: tuple[RemoteRun, ...]


class ClusterLookup:
    """The cluster index as the scheduler half reads it (see the module docstring).

    Args:
        config: ``engine.cluster_lookup_*`` bound and pace the lookups.
        index: a ``ClusterIndex``-like object (``lookup``, ``failures``); by default one
            on ``config.store.cluster_url`` as ``store.node_id``, not joined.
        stats: counts ``cluster_lookup_failures``.
    """

    def __init__(self, geometry: KVGeometry, config: FlatCakeConfig, *,
                 index: Index | None = None,
                 now: Callable[[], float] = time.monotonic,
                 stats: Counter[str] | None = None) -> None:
        store, engine = config.store, config.engine
        if not store.cluster_url and index is None:
            raise ValueError("ClusterLookup needs store.cluster_url")
        if index is None:
            from flatcake.cluster.index import ClusterIndex

            index = ClusterIndex(store.cluster_url, store.node_id, cluster=store.cluster_name,
                                 timeout_s=min(store.remote_timeout_s,
                                             engine.cluster_lookup_timeout_s))
        self.index: Index = index
        self.geometry = geometry
        self.retry_s = engine.cluster_lookup_retry_s
        self.fresh_s = engine.cluster_lookup_fresh_s
        self.first_chunk = engine.cluster_lookup_first_keys
        self._now = now
        self._down_until = float("-inf")
        self._looked: dict[str, _Looked] = {}
        self.stats: Counter[str] = stats if stats is not None else Counter()
        self.lookups = 0  # lookups asked of Redis

    def runs(self, request_id: str, keys: Sequence[bytes], start: int
             ) -> tuple[RemoteRun, ...]:
        """Runs of the blocks other nodes hold from request block ``start`` on (in
        ``keys``); () when none, when Redis failed, or while backing off after that."""
        if start >= len(keys):
            return ()
        now = self._now()
        seen = self._looked.get(request_id)
        if seen is not None and seen.start == start and seen.end == len(keys) \
                and now - seen.at < self.fresh_s:
            return seen.runs
        if now < self._down_until:
            return ()
        before = self.index.failures
        self.lookups += 1
        try:
            hits = self._lookup(keys[start:])
            found = remote_runs(hits, start, self.geometry.layer_block_bytes)
            ok = self.index.failures == before
        except Exception as exc:  # never an exception into the engine
            logger.warning("cluster index lookup failed: %s", exc)
            ok, found = False, ()
        if not ok:
            self.stats["cluster_lookup_failures"] += 1
            self._down_until = now + self.retry_s
            logger.warning("FlatCake: the cluster index did not answer; lookups are "
                           "local-only for %.0f s", self.retry_s)
            return ()
        self._looked[request_id] = _Looked(start, len(keys), now, found)
        return found

    def _lookup(self, keys: Sequence[bytes]) -> list[IndexHit]:
        """The prefix of ``keys`` other nodes hold, asked in growing chunks: a miss (most
        new prompts) costs one small lookup, a long hit a few."""
        hits: list[IndexHit] = []
        size = self.first_chunk
        while len(hits) < len(keys):
            chunk = keys[len(hits):len(hits) + size]
            found = self.index.lookup(chunk, prefix=True)
            hits.extend(found)
            if len(found) < len(chunk):
                break
            size *= 4
        return hits

    def forget(self, request_id: str) -> None:
        """The request left the engine."""
        self._looked.pop(request_id, None)

    def close(self) -> None:
        self.index.close()


def scheduler_lookup(geometry: KVGeometry, config: FlatCakeConfig, world_size: int,
                     stats: Counter[str]) -> ClusterLookup | None:
    """The embedded scheduler half's cluster lookup; None without ``store.cluster_url``.
    Refused with tensor parallelism: each rank keeps its own arena and files (attach the
    engine to a node service, which is the node's one member)."""
    if not config.store.cluster_url:
        return None
    if world_size != 1:
        raise ValueError(
            f"store.cluster_url with tensor parallel size {world_size}: each rank keeps its "
            "own arena and files, and a node id per rank is not a design FlatCake has; "
            "attach the engine to a node service (store.node, `flatcake serve` with "
            "store.cluster_url), or run tensor parallel size 1 in a cluster")
    return ClusterLookup(geometry, config, stats=stats)


def member_lookup(geometry: KVGeometry, config: FlatCakeConfig, member: NodeMember | None,
                  stats: Counter[str]) -> ClusterLookup | None:
    """The lookup of a scheduler half hosted by a node service; None when the service is
    in no cluster. Every tensor-parallel layout is served: the service keeps one entry
    per block, its parts' crcs in the record."""
    if member is None:
        return None
    return ClusterLookup(geometry, config, index=member.lookup_index(), stats=stats)
