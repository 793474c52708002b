"""The store's side of the cluster (``store.cluster_url`` set): what it publishes, what
it removes, and where it looks after its local prefix.

Lifecycle of the cluster index entries of one store (``cluster.service`` applies them in
this order on its own thread)::

    open      recovery rebuilt the books -> re-publish every SSD segment kept (the
              store joined under a new epoch, so its older entries were ignored)
    store     the segment is durable (SSD: written + fdatasync; memory: copied) and
              the books published it -> publish key -> address + the segment record
              (layout, file name and offset on SSD, crc32 of every layer)
    reclaim   the books dropped segments (reclaim, drop_session, a cut before damage)
              -> remove their entries
    load      the local prefix ends at block h -> look keys[h:] up (batched) -> remote
              runs for the executor's remote readers

Redis down at open is not an error here: the service joins in the background
(``ClusterService`` with ``background_join``, for every host of the store: the library
and the vLLM worker) and the store serves local-only until then; ``flatcake node`` joins
strictly on its own (``cluster.node``).

The crc32s of a memory segment are computed once, right after its copy and before it is
published (the arena has none of its own); an SSD segment's come from its header.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from flatcake.cio.crc import crc32
from flatcake.cio.format import parse_session_file_name, session_file_name
from flatcake.control import ControlPlane, ReclaimAction
from flatcake.control.address import Medium
from flatcake.control.index import Segment
from flatcake.plan.remote import RemoteRun, remote_runs, segment_record

if TYPE_CHECKING:
    from flatcake.cio.executor import Executor
    from flatcake.cluster.service import ClusterService, Published


def session_file(sessions_dir: Path, name: str) -> str | None:
    """A session file of ``sessions_dir`` by name (the owner side of remote SSD reads);
    only names of the session file form, only files that exist."""
    file_id = parse_session_file_name(name)
    if file_id is None:
        return None
    path = sessions_dir / session_file_name(file_id)
    return str(path) if path.is_file() else None


def segment_crcs(executor: Executor, seg: Segment) -> tuple[int, ...] | None:
    """crc32 of each layer of a durable segment ``executor`` wrote or recovered: an SSD
    segment's from its header (the executor's crc book), a memory segment's computed
    from the arena (None: unknown, do not publish)."""
    if seg.medium == Medium.SSD:
        with executor.lock:
            book = executor.crcs.get((int(seg.file_id or 0), int(seg.file_offset or 0)))
            return None if book is None else book.layers
    lay = seg.layout
    view = executor.arena.view(seg.offset, lay.data_bytes).numpy().data
    return tuple(crc32(view[lay.layer_offset(i):lay.layer_offset(i) + lay.layer_bytes(i)])
                 for i in range(lay.num_layers))


def published(seg: Segment, crcs: Sequence[int], parts: Sequence[Sequence[int]] = ()
              ) -> Published:
    """The index entry of a durable segment: ``(segment id, keys, block addresses,
    record)`` (``parts``: every tensor-parallel part's crcs, for a node of several)."""
    location = session_file_name(int(seg.file_id)) if seg.file_id is not None else ""
    return (seg.segment_id, seg.keys, [seg.block_address(0, i) for i in range(seg.num_blocks)],
            segment_record(seg, crcs, location, parts))


class StoreCluster:
    """One store's membership in the cluster (see the module docstring)."""

    def __init__(self, executor: Executor, sessions_dir: Path) -> None:
        from flatcake.cio.remote import nixl_available
        from flatcake.cluster.service import ClusterService

        cfg = executor.config.store
        why = nixl_available()
        if why:
            raise RuntimeError(f"store.cluster_url is set but this interpreter cannot run "
                               f"the remote readers: {why}")
        self._exec = executor
        self._sessions = sessions_dir
        arena = executor.arena.tensor.numpy()
        self.service: ClusterService = ClusterService(
            cfg.cluster_url, cfg.node_id, arena, self._file, cluster=cfg.cluster_name,
            window_bytes=cfg.remote_window_bytes, windows=cfg.remote_windows,
            timeout_s=cfg.remote_timeout_s)
        executor.readers.remote_source = self.service.reader

    def _file(self, name: str) -> str | None:
        return session_file(self._sessions, name)

    def segment_crcs(self, seg: Segment) -> tuple[int, ...] | None:
        """crc32 of each layer of a durable segment (None: unknown, do not publish)."""
        return segment_crcs(self._exec, seg)

    def publish(self, segments: Sequence[tuple[Segment, Sequence[int] | None]]) -> None:
        """Queue durable segments (with their crcs; None = skipped) for the index."""
        self.service.publish([published(seg, crcs) for seg, crcs in segments
                              if crcs is not None])

    def republish(self, control: ControlPlane) -> None:
        """After recovery: every SSD segment the books kept, under the new epoch."""
        self.publish([(seg, self.segment_crcs(seg)) for seg in control.segments()
                      if seg.medium == Medium.SSD])

    def dropped(self, actions: Sequence[ReclaimAction]) -> None:
        """Queue the removal of every segment the books dropped."""
        self.service.remove([(seg.segment_id, seg.keys) for a in actions
                             for seg in (*a.memory_segments, *a.ssd_segments)])

    def remote(self, keys: Sequence[bytes], start: int,
               layer_block_bytes: tuple[int, ...]) -> tuple[RemoteRun, ...]:
        """Runs of the blocks other nodes hold from request block ``start`` on."""
        if start >= len(keys):
            return ()
        hits = self.service.lookup(keys[start:])
        return remote_runs(hits, start, layer_block_bytes)

    def close(self) -> None:
        self.service.close()
