"""The node service: one FlatCake per machine, shared by every engine on it.

It holds the root's ``LOCK`` (and every tensor-parallel part's root), recovers the files
at the first attach (the engines' geometry names their layout), owns the books (one
``ControlPlane``: index, placement, allocation, reclaim, damage) and one FC-MAS queue per
attached engine, and keeps the shared arena files. It never moves a KV byte: each
engine's scheduler half calls it (``client.RemoteSchedulerSide``) and its workers run the
``StepPlan`` it returns on the shared files and arena, as embedded workers do::

    attach(name, pid, geometry, ranks, config)        -> Attached   an engine's half
    worker(rank, geometry, ranks)                     -> WorkerRoot  a worker's files
    attach_store(name, pid, geometry, tenant)         -> Attached   a FlatCakeStore
    <engine verb>(args)        -> its SchedulerSide's answer (``connectors.node_verbs``)
    <books verb>(args)         -> the books' answer, for a store (``link.verbs.CONTROL``)
    detach / status

Every verb's arguments and answer have declared types (``link.verbs``); the frames, and
the protocol version every call carries, are ``link.wire``'s.

Tensor parallelism (``wire.TensorRanks``): a block is one entry in the books. Its parts
(one per rank, heads split) lie at the same offsets of the same file in each part's
directory ``ROOT/tp<part>``, each written and read by its rank; a replicated part (MLA's
latent) is one, in ``ROOT`` itself, written by rank 0 and read by every rank.

Identity: an engine or store is bound to the caller that attached it (its connection,
or another connection of the same process: ``link.trust.Owner``); a call naming one
another caller attached is refused, whatever id it sends.

Tenants: each engine and store names its tenant (a digest of its key salt,
``control.keys.tenant_tag``; an engine's is its ``engine.tenant_salt``'s)
when it attaches; the session ids it sends are its tenant's own (``service.tenants``
prefixes them with its tenant for the books, and strips the prefix from answers), and
every session verb of an attached store, and every hit of an engine, is scoped to its
tenant's sessions (another tenant's is refused by name; an engine's hit of one is a
miss).

Leases: every call renews its engine's; an engine silent for ``store.node_lease_s`` is
released: its restores' pins dropped, its unfinished writes rolled back (never
published); those its processes may still write are fenced (``service.fences``: never
published, their ranges held until its workers report them or its processes are gone);
its FC-MAS queue gone. It re-attaches on its next call, as after a service restart.
An engine whose client gave up on a step (its answer came past the timeout) is released
as soon as that client's next call names the step: the step's stores, which no worker
was handed, rolled back at once.

Files: the service deletes and cuts the session files the books drop, and punches the
window rows they release, itself (``NodeParts.files``), whichever client's call made
the reclaim or the release; an attached store is told only of its own tenant's sessions
dropped.

An attached store's ``servable`` that must wait for a store in flight (``wait_s``) is
held and answered once that store is durable, failed or rolled back, or its wait is up.

In a cluster (``store.cluster_url`` in the service's configuration) the service is the
node's member of the cluster index (``service.cluster``): node id = machine, whatever
the engines' tensor parallelism.

The socket and its loop: ``service.endpoint``; the parts' files: ``service.arena``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flatcake.cio.direct import ensure_private_dir
from flatcake.cio.executor import Executor
from flatcake.cio.files import SessionFiles
from flatcake.cio.hugepages import shared_arena_pages
from flatcake.cio.scan import recover_files
from flatcake.clock import WallClock
from flatcake.config import FlatCakeConfig
from flatcake.connectors.node_verbs import ADMISSION, ATTACH, ENGINE
from flatcake.connectors.requests import RequestView
from flatcake.connectors.scheduler_side import NodeParts, SchedulerSide
from flatcake.control import ControlPlane, FileCut
from flatcake.control.keys import TENANT_TAG_BYTES, tenant_tag
from flatcake.control.types import WindowRelease
from flatcake.geometry import KVGeometry
from flatcake.layout import describe_layers
from flatcake.link import trust, verbs, wire
from flatcake.link.trust import Caller, Owner
from flatcake.link.wire import Attached, TensorRanks, WorkerRoot
from flatcake.plan.tasks import FileDrop, StepPlan, WorkerReport
from flatcake.service.arena import make_arena, rank_dir
from flatcake.service.cluster import STORES_IN_CLUSTER, NodeCluster, join_cluster, same_cluster
from flatcake.service.connections import ConnectionCap
from flatcake.service.endpoint import CallLoop, listening
from flatcake.service.fences import Fenced, fence, free_fenced, process_start, reported
from flatcake.service.stores import (
    AttachedStore,
    ServableWait,
    abandon_calls,
    attached_call,
    release_store,
)
from flatcake.service.tenants import SessionTenants, TenantScope

logger = logging.getLogger("flatcake.service")


@dataclass(slots=True)
class _Engine:
    engine_id: str
    name: str
    pid: int
    side: SchedulerSide
    last_call: float
    owner: Owner
    tenant: bytes
    started: int | None  # its process's start time (``fences.process_start``)
    # The stores (segment ids) each of its last steps handed its workers, by call id:
    # a step its client gave up on was never read, so no worker has its stores.
    steps: dict[int, frozenset[int]] = dataclasses.field(default_factory=dict)


socket_path = wire.socket_path


class NodeService(CallLoop):
    """The node service of ``root`` (see the module docstring)."""

    def __init__(self, root: Path, config: FlatCakeConfig, socket: Path) -> None:
        self.root = Path(root).absolute()
        self.config = config
        self.socket = Path(socket).absolute()
        self.lease_s = config.store.node_lease_s
        self.verb_table = {ATTACH.name: ATTACH, **verbs.SERVICE, **verbs.CONTROL, **ENGINE}
        ensure_private_dir(self.root)
        self._lock = SessionFiles(self.root, "buffered")
        self._lock.lock_root()  # no embedded store opens this root while we serve
        self._lock_held = True  # (until the books' executor of the root holds it)
        self._parts: NodeParts | None = None
        self._geometry: KVGeometry | None = None
        self._ranks = TensorRanks()
        self._rank_roots: list[Executor] = []
        self._member: NodeCluster | None = None
        self._arenas: list[Path] = []
        self._engines: dict[str, _Engine] = {}
        self._stores: dict[str, AttachedStore] = {}
        # Unfinished writes of engines and stores whose lease ended (``service.fences``).
        self._fenced: list[Fenced] = []
        self._tenants = SessionTenants(self.root)
        # Stores' ``servable`` calls held for a store in flight: (their socket, call id).
        self._waits: list[tuple[int, int, ServableWait]] = []
        self._next_engine = 0
        self._bound = False  # the socket file is ours to remove at close
        self._conns = ConnectionCap(config.store.node_max_connections_per_uid)
        try:
            self._bind()
        except (OSError, ValueError):
            self.close()
            raise
        self.calls = 0
        self.arena_pages = shared_arena_pages(config.store.node_arena_dir)
        try:  # refused now, not at the first attach, when hugetlbfs cannot hold it
            make_arena(self.root, config, self.arena_pages, 0,
                       config.store.memory_capacity_bytes)
        except (OSError, ValueError):
            self.close()
            raise
        logger.info("shared arena in %s: %s", config.store.node_arena_dir,
                    self.arena_pages.note)

    def _bind(self) -> None:
        """Listen on ``self.socket``: its directory made 0700 or checked, a stale socket
        of ours replaced, anything else there refused (``link.trust``); the socket is
        0600 (connecting needs write access to it), or 0660 and the group's with
        ``store.node_socket_group`` (its directory 0750)."""
        gid = trust.socket_group(self.config.store.node_socket_group)
        trust.socket_dir(self.socket.parent, gid)
        if trust.stale_socket(self.socket):
            if listening(self.socket):
                raise ValueError(f"another node service listens on {self.socket}: stop "
                                 "it, or give this one another --socket")
            self.socket.unlink()
        old = os.umask(0o177)
        try:
            self._listen(self.socket)
        finally:
            os.umask(old)
        self._bound = True
        trust.socket_access(self.socket, gid)

    # -- the books, made at the first attach ----------------------------------------

    def _ensure_books(self, geometry: KVGeometry, ranks: TensorRanks) -> NodeParts:
        if self._parts is not None:
            if geometry != self._geometry or ranks != self._ranks:
                raise wire.NodeRefused(
                    f"this node service serves {_words(self._geometry)} at {self._ranks}; "
                    f"an engine of {_words(geometry)} at {ranks} cannot share it: run one "
                    "service per model")
            return self._parts
        try:
            return self._make_books(geometry, ranks)
        except Exception as exc:
            # Refused (a geometry the root's files were not written with, a part that
            # cannot be recovered): the service and its root stay as they were, the
            # root locked by the service, free for the right engine's attach.
            self._unmake_books()
            logger.warning("an engine of %s at %s refused: %s", geometry, ranks, exc)
            if isinstance(exc, ValueError) and not isinstance(exc, wire.NodeRefused):
                raise wire.NodeRefused(f"{exc}") from None
            raise

    def _make_books(self, geometry: KVGeometry, ranks: TensorRanks) -> NodeParts:
        """Recover every part's files (all recovered before any is settled, so a part
        that fails leaves every file as it was), make the arenas and the books."""
        cfg = self.config
        parts = ranks.parts
        if parts == 1:
            self._lock.close()  # the part's root is the root: its executor locks it
            self._lock_held = False
        quiet = dataclasses.replace(cfg, store=dataclasses.replace(
            cfg.store, memory_capacity_bytes=0))
        recovered = []
        for part in range(parts):
            ex = Executor(rank_dir(self.root, part, parts), geometry, quiet)
            self._rank_roots.append(ex)
            scratch = ControlPlane(geometry, cfg, WallClock())
            recovered.append((scratch, *recover_files(scratch, ex.files.sessions_dir)))
        for ex, (scratch, scan, recovery) in zip(self._rank_roots, recovered, strict=True):
            ex.settle(scan, recovery, scratch)
            ex.share()  # the engines' workers write its files from now on
        self._arenas = [make_arena(self.root, cfg, self.arena_pages, part,
                                   cfg.store.memory_capacity_bytes) for part in range(parts)]
        books = dataclasses.replace(NodeParts.embedded(
            geometry, cfg, rank_dir(self.root, 0, parts), WallClock()),
            files=self._file_work)
        if cfg.store.cluster_url:  # the node's member of the cluster index
            self._member = join_cluster(cfg, geometry, self._rank_roots, self._arenas,
                                        books.control)
            books = dataclasses.replace(books, cluster=self._member)
        self._parts = books
        self._geometry, self._ranks = geometry, ranks
        logger.info("books of %s: %d segments recovered, %s blocks, %s",
                    self.root, self._parts.recovered_segments,
                    describe_layers(geometry.layer_block_bytes), ranks)
        return self._parts

    def _file_work(self, drops: Sequence[FileDrop], cuts: Sequence[FileCut],
                   releases: Sequence[WindowRelease]) -> None:
        """Delete and cut the files the books dropped and punch the window rows they
        released, in every part's directory: the service's own work, never a client's
        (a reclaim one engine's or store's call triggered may drop another tenant's
        sessions; the rows a newer turn superseded may be another tenant's)."""
        for ex in self._rank_roots:
            for cut in cuts:
                ex.cut(cut)
            for drop in drops:
                ex.drop(drop.file_id, drop.quarantine)
            for rel in releases:
                ex.release_window(rel)

    def _unmake_books(self) -> None:
        """Undo a ``_make_books`` that failed: its parts closed, the root locked by the
        service again."""
        if self._member is not None:
            self._member.close()
            self._member = None
        for ex in self._rank_roots:
            ex.close()
        self._rank_roots, self._arenas = [], []
        if not self._lock_held:
            self._lock.lock_root()
            self._lock_held = True

    # -- calls ----------------------------------------------------------------------

    def handle(self, method: str, engine_id: str, args: dict[str, Any],
               caller: Caller, call_id: int = 0) -> Any:
        """Answer call ``call_id`` of ``caller``: ``method`` with ``args`` by parameter
        name, decoded as ``self.verb_table[method]`` declares (raises ``NodeRefused`` for a
        call it refuses)."""
        self.calls += 1
        now = time.monotonic()
        if method == ATTACH.name:
            return self._attach(now, caller.owner(), **args)
        if method == verbs.WORKER.name:
            rank, ranks = args["rank"], args["ranks"]
            self._ensure_books(args["geometry"], ranks)
            part = ranks.part(rank)
            return WorkerRoot(rank_dir(self.root, part, ranks.parts), self._arenas[part],
                              self.config, writes=ranks.writes(rank), part=part,
                              parts=ranks.parts)
        if method == verbs.STATUS.name:
            return self.status()
        if method == verbs.ATTACH_STORE.name:
            return self._attach_store(now, caller.owner(), **args)
        store = self._stores.get(engine_id)
        if store is not None:
            if not store.owner.admits(caller):
                raise store.owner.refuse(f"store {engine_id!r}")
            store.last_call = now
            if method == verbs.DETACH.name:
                self._release_store(store, "detached")
                return None
            if method not in verbs.CONTROL:
                raise wire.NodeRefused(f"unknown call {method!r} of a store")
            return attached_call(store, self._books(), self._tenants, call_id, method, args,
                                 files=self._file_work)
        engine = self._engines.get(engine_id)
        if engine is None:
            raise wire.NodeRefused(f"{wire.UNKNOWN_ENGINE} {engine_id!r} (its lease ended "
                                   "or the service restarted): attach again")
        if not engine.owner.admits(caller):
            raise engine.owner.refuse(f"engine {engine_id!r}")
        engine.last_call = now
        if method == verbs.DETACH.name:
            self._release(engine, "detached")
            return None
        if method not in ENGINE:
            raise wire.NodeRefused(f"unknown call {method!r} of an engine")
        side, values = engine.side, tuple(args.values())
        if method == "step":
            preempted, computed, done, admitted = values
            _finished(side, done)
            refused = _admit(side, admitted)
            plan: StepPlan = side.build_step(preempted, computed)
            for task in plan.stores:  # the engine writes them
                self._tenants.claim(self._books(), engine.tenant, task.plan.session_id)
            if plan.stores:
                engine.steps[call_id] = frozenset(t.plan.segment.segment_id
                                                  for t in plan.stores)
                if len(engine.steps) > wire.MAX_GAVE_UP:
                    del engine.steps[next(iter(engine.steps))]
            return plan, side.has_work(), side.take_events(), refused
        if method == "update":
            report, finished, done = values
            _finished(side, done)
            if report is not None and self._fenced:
                # Its workers' reports of writes fenced when its last lease ended.
                report = dataclasses.replace(report, stores=reported(
                    self._fenced, self._books(), engine.pid, report.stores))
            if report is not None:
                side.on_report(report)
            return (side.take_released(finished), side.has_work(), side.take_events(),
                    _loaded(side, report))
        if method == "num_matched_tokens":
            req, num_local_tokens, entered, new, done, admitted = values
            for other in new:
                side.new_request(other)
            if entered:
                side.new_request(req)
            _finished(side, done)
            refused = _admit(side, admitted)
            rid = req.request_id
            n, is_async = side.num_matched_tokens(req, num_local_tokens)
            return (n, is_async, side.request_params(rid),
                    side.looked_up_sources(rid) if n else (0, 0), refused,
                    side.held_whole(rid))
        if method == "after_alloc":
            side.after_alloc(*values)
            return side.hit_sources(args["request_id"])
        out = getattr(side, method)(*values)
        if method == "prompt_computed" and out is not None:  # the engine writes it
            self._tenants.claim(self._books(), engine.tenant, out.session_id)
        return out

    def gave_up(self, engine_id: str, caller: Caller, call_ids: tuple[int, ...]) -> None:
        """``caller`` stopped waiting for ``call_ids`` of store ``engine_id``: what they
        prepared is rolled back, and one not read yet is never run. An engine that gave
        up on a call attaches anew (the call naming them is its attach): the old one is
        released now if they name one of its steps, whose stores no worker was handed
        (rolled back; those of the steps it read fenced as at a lease's end), else when
        its lease ends."""
        store = self._stores.get(engine_id)
        if store is not None and store.owner.admits(caller):
            abandon_calls(store, self._books(), call_ids)
        for engine in list(self._engines.values()):
            unread = frozenset().union(*(engine.steps.get(c, ()) for c in call_ids))
            if unread and engine.owner.admits(caller):
                self._release(engine, f"gave up on a step (its {len(unread)} stores "
                              "never handed to its workers: rolled back)",
                              lease_ended=True, unread=unread)

    def _attach(self, now: float, owner: Owner, name: str, pid: int,
                geometry: KVGeometry, ranks: TensorRanks, config: FlatCakeConfig,
                async_loads: bool = False) -> Attached:
        same_cluster(config, self.config)
        parts = self._ensure_books(geometry, ranks)
        engine_id = f"e{self._next_engine}"
        self._next_engine += 1
        # The service's store, budgets and policies; the engine's own [engine] keys.
        mine = dataclasses.replace(self.config, engine=config.engine)
        tenant = tenant_tag(config.engine.tenant_salt)
        side = SchedulerSide(geometry, mine, rank_dir(self.root, 0, ranks.parts),
                             world_size=ranks.world_size, node=parts, queue=engine_id,
                             async_loads=async_loads,
                             scope=TenantScope(self._tenants, parts.control, tenant))
        pid = owner.credentials[0] if owner.credentials else pid  # the peer's, if known
        self._engines[engine_id] = _Engine(engine_id, name, pid, side, now, owner, tenant,
                                           process_start(pid))
        logger.info("engine %s attached (%s, pid %d)", engine_id, name, pid)
        return Attached(engine_id, self.config, parts.recovered_segments)

    def _books(self) -> ControlPlane:
        assert self._parts is not None  # a store attached: the books exist
        return self._parts.control

    def _release_store(self, store: AttachedStore, why: str, lease_ended: bool = False
                       ) -> None:
        del self._stores[store.client_id]
        fenced = release_store(store, self._parts.control if self._parts is not None
                               else None, why, lease_ended=lease_ended)
        if fenced is not None:
            self._fenced.append(fenced)

    def _attach_store(self, now: float, owner: Owner, name: str, pid: int,
                      geometry: KVGeometry, tenant: bytes = b"") -> Attached:
        if self.config.store.cluster_url:
            raise wire.NodeRefused(STORES_IN_CLUSTER)
        if len(tenant) not in (0, TENANT_TAG_BYTES):
            raise wire.NodeRefused(f"attach_store: a tenant is control.keys.tenant_tag's "
                                   f"{TENANT_TAG_BYTES} bytes (or none), got {tenant!r}")
        parts = self._ensure_books(geometry, TensorRanks())
        client_id = f"s{self._next_engine}"
        self._next_engine += 1
        pid = owner.credentials[0] if owner.credentials else pid  # the peer's, if known
        self._stores[client_id] = AttachedStore(client_id, name, pid, now,
                                               process_start(pid), owner=owner,
                                               tenant=tenant)
        logger.info("store %s attached (%s, pid %d)", client_id, name, pid)
        return Attached(client_id, self.config, parts.recovered_segments)

    def _release(self, engine: _Engine, why: str, lease_ended: bool = False,
                 unread: frozenset[int] = frozenset()) -> None:
        """Its restores unpinned, its unfinished writes rolled back; those its workers
        were handed fenced where its lease ended and its processes may still write them
        (``service.fences``: freed once its workers report them or its processes are
        gone). ``unread``: stores (segment ids) of steps its client never read, which
        no worker has (none reported them): rolled back."""
        del self._engines[engine.engine_id]
        busy = engine.side.has_work()
        writing = engine.side.abandon()
        control = self._books()
        for plan, n in [(p, n) for p, n in writing
                        if n == 0 and p.segment.segment_id in unread]:
            control.complete_store(plan, False)
            writing.remove((plan, n))
        fenced = None
        if lease_ended:
            fenced = fence(control, f"engine {engine.engine_id}", engine.pid,
                           engine.started, [p for p, _ in writing], engine.side.world_size,
                           {p.segment.segment_id: n for p, n in writing if n})
        else:
            for plan, _ in writing:
                control.complete_store(plan, False)
        if fenced is not None:
            self._fenced.append(fenced)
        control.drop_restore_queue(engine.engine_id)
        # An idle engine whose lease ends loses nothing (it attaches again when it calls).
        (logger.warning if busy else logger.info)(
            "engine %s (%s, pid %d) %s%s", engine.engine_id, engine.name, engine.pid, why,
            "" if not busy else ": its restores unpinned, its unfinished writes rolled back"
            if fenced is None else ": its restores unpinned, its unfinished writes fenced "
            f"(never published, the ranges of {len(fenced.plans)} held until its workers "
            "report them or its processes are gone)")

    def expire(self, now: float | None = None) -> int:
        """Release every engine silent for longer than its lease; how many."""
        now = time.monotonic() if now is None else now
        why = f"silent for over {self.lease_s:g} s (lease ended)"
        late = [e for e in self._engines.values() if now - e.last_call > self.lease_s]
        for engine in late:
            self._release(engine, why, lease_ended=True)
        gone = [s for s in self._stores.values() if now - s.last_call > self.lease_s]
        for store in gone:
            self._release_store(store, why, lease_ended=True)
        if self._parts is not None:
            self._fenced = free_fenced(self._fenced, self._parts.control)
            self._tenants.sweep(self._parts.control)
        return len(late) + len(gone)

    def status(self) -> dict[str, Any]:
        """Engines attached and the books' figures (``flatcake serve --status``)."""
        out: dict[str, Any] = {"root": str(self.root), "socket": str(self.socket),
                               "engines": {e.engine_id: {"name": e.name, "pid": e.pid}
                                           for e in self._engines.values()},
                               "stores": {s.client_id: {"name": s.name, "pid": s.pid}
                                          for s in self._stores.values()},
                               "fenced_stores": len(self._fenced),
                               "calls": self.calls, "arena_dir":
                               self.config.store.node_arena_dir,
                               "arena_pages": self.arena_pages.note,
                               "arena_huge_pages": self.arena_pages.huge}
        if self._parts is not None:
            out.update(self._parts.control.stats().status(),
                       world_size=self._ranks.world_size,
                       replicated_kv=self._ranks.replicated)
        return out

    def close(self) -> None:
        """Stop answering and release every root lock. The arena files stay (engines
        still attached map them; ``rm`` them once every engine has stopped)."""
        self._stop_listening()
        if self._bound:
            self.socket.unlink(missing_ok=True)
        if self._member is not None:  # leave the index before the files go
            self._member.close()
            self._member = None
        for ex in self._rank_roots:
            ex.close()
        self._tenants.close()
        self._lock.close()


def _words(g: KVGeometry | None) -> str:
    """A geometry for a refusal: its name, layer kinds and block bytes, then the whole
    value (two geometries alike in those still differ somewhere)."""
    if g is None:
        return "no geometry"
    kinds = " + ".join(f"{grp.num_layers} {grp.kind}" for grp in g.layer_groups)
    return (f"geometry {g.name!r} ({kinds} layers; "
            f"{describe_layers(g.layer_block_bytes, g.layer_window_blocks)} blocks of "
            f"{g.tokens_per_block} tokens: {g})")


def _admit(side: SchedulerSide, admitted: tuple[ADMISSION, ...]) -> list[str]:
    """The hits an engine admitted since its last call, each ``after_alloc`` in order;
    the requests whose load could not be planned (a hit no longer servable: the engine
    recomputes them). One refusal never fails the call carrying the others."""
    refused = []
    for request_id, block_ids, num_external_tokens in admitted:
        try:
            side.after_alloc(request_id, block_ids, num_external_tokens)
        except Exception as exc:  # its own call would have been refused
            logger.info("the load of request %s was not planned: %s", request_id, exc)
            refused.append(request_id)
    return refused


def _loaded(side: SchedulerSide, report: WorkerReport | None) -> dict[str, dict[str, Any]]:
    """The ``kv_transfer_params`` of the live requests whose load ``report`` ended (every
    worker reported it): what their ``request_finished`` answers from now on, bar the
    store (the engine half answers it; ``connectors.node_client``)."""
    out: dict[str, dict[str, Any]] = {}
    for done in report.loads if report is not None else ():
        tracked = side.requests.get(done.request_id)
        if tracked is not None and not tracked.loading:
            out[done.request_id] = side.request_params(done.request_id) or {}
    return out


def _finished(side: SchedulerSide, done: tuple[RequestView, ...]) -> None:
    """The requests an engine's half answered finished itself (``done``): the books
    learn each, in order, before anything else of the call."""
    for req in done:
        side.request_finished(req)
