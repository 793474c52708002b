"""``FlatCakeStore``: the public store = the books (``control.ControlPlane``) + the
executor (``cio.executor``) in one process, over the same tasks (``plan.tasks``) as the
vLLM connector's two halves, driving the same request protocol (``plan.requests``)::

    store_turn:  begin_store -> StoreTask -> executor: gather + write (+ fdatasync)
                 -> end_store (attached: two calls to the node service); then the
                 not-yet homes the reclaim handed over (``take_write_backs``):
                 each written from its arena range as an SSD store, the same way
    load:        servable (waits for a store in flight of the next blocks) -> load
                 (reads only the hit's blocks) -> LoadTask -> FC-MAS queues
                 (``store.restores``) -> executor: staging window: read, verify crc32,
                 scatter per layer -> finish_load
    reclaim:     control.reclaim -> delete the files it names; write the not-yet
                 homes it hands over (``placement.not_yet_write_back``)
    damage:      a segment fails its crc32 -> it and the rest of the load are a miss ->
                 settle: cut the file before it, delete later files (quarantine them
                 when the file header is damaged too)
    open:        scan session files -> control.recover_segment for each valid segment
    cluster:     (``store.cluster_url`` set; ``store.cluster``) publish durable segments,
                 remove dropped ones, re-publish after recovery; a load's remote part
                 (blocks other nodes hold after the local prefix) goes to the remote
                 readers of the executor's (medium, node) dispatch

Damage while serving: a segment that fails its checksum is never returned as KV. Its
session is cut there once no restore or write in flight touches the cut-off part
(until then lookups stop before it): the damaged segment and the session's later
segments are unpublished, their SSD space given back, the file truncated on disk (so a
restart cannot resurrect them), and later turns append after the last good segment.
The earlier turns stay served. Only a damaged *file header* (checked before the cut)
sends the session's files to ``quarantine/``.

Threads: any thread may call the public methods. ``self._lock`` serialises every call
into the control plane and guards the store's own books (open files, segment
pending cuts, FC-MAS queues); it is never held across I/O except the small, rare file
cuts. ``self._unpinned`` (on the same lock) is notified whenever a restore or write
ends, which is what a pending cut waits for. Restores are ordered by FC-MAS
(``store.restores``) and run on the executor's ``scheduler.max_restores_in_flight``
staging windows: a restore that finds every window busy waits in the SSD-preparing
queue; it is never cancelled.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch

from flatcake.cio.arena import ArenaBuffer
from flatcake.cio.executor import CLOSE_WAIT_S, Executor, LoadOutcome, StoreOutcome
from flatcake.cio.holes import releases_windows
from flatcake.cio.paged import BlockIds, PagedKV
from flatcake.cio.readers import Reader
from flatcake.cio.restore import LayerReady, OpenFile
from flatcake.clock import Clock, WallClock
from flatcake.config import FlatCakeConfig
from flatcake.control import (
    EMPTY_HIT,
    STALE_HIT,
    ControlPlane,
    LoadPlan,
    ReclaimAction,
    StorePlan,
)
from flatcake.control.address import Medium
from flatcake.control.keys import check_key, tenant_tag
from flatcake.control.signals import HitOwner, hit_owner
from flatcake.geometry import KVGeometry, preset
from flatcake.plan.remote import RemoteRun
from flatcake.plan.requests import (
    Servable,
    StoreBegun,
    begin_store,
    by_medium,
    end_store,
    finish_load,
    load,
    reclaim_tasks,
    servable,
    settle,
    ssd_held_bytes,
    store_task,
)
from flatcake.plan.tasks import StoreTask
from flatcake.store.cluster import StoreCluster
from flatcake.store.inspect import FsckReport, fsck_root
from flatcake.store.record import write_record
from flatcake.store.recovery import recover_root
from flatcake.store.restores import LoadHandle, Restores
from flatcake.store.results import (
    LoadResult,
    LookupResult,
    ReclaimResult,
    RecoveryReport,
    StoreResult,
    TurnSignals,
)
from flatcake.store.snapshot import snapshot

if TYPE_CHECKING:
    from flatcake.link.control import RemoteControl

logger = logging.getLogger(__name__)

# Attached: lookups again after a hit another process reclaimed, before serving a miss.
STALE_TRIES = 3


class FlatCakeStore:
    """A FlatCake KV store rooted at a directory. Open it with ``FlatCakeStore.open``."""

    def __init__(self, root: Path, geometry: KVGeometry, config: FlatCakeConfig,
                 clock: Clock, verify_on_open: bool, tenant_salt: str | bytes = b"") -> None:
        self.root = root
        self.geometry = geometry
        self.config = config
        self._rid_prefix = ""
        # ``store.node``: attached to the machine's node service, which holds the root
        # and the books; this store runs its own I/O on the shared files and arena.
        self.attached = bool(config.store.node)
        self._remote: RemoteControl | None = None  # attached: the books, through the service
        if self.attached:
            self._attach(geometry, config, clock, tenant_tag(tenant_salt))
        else:
            self._exec = Executor(root, geometry, config)
            self.control = ControlPlane(geometry, config, clock,
                                        release_windows=self._can_release(config),
                                        write_backs=True)
        self.io_mode = self._exec.io_mode
        self._lock = threading.Lock()
        self._unpinned = threading.Condition(self._lock)
        self._restores = Restores(self._unpinned, self.control, self._exec,
                                  self._load_finished)
        self._request_ids = itertools.count()
        self._closed = False
        self._cluster: StoreCluster | None = None
        if self.attached:
            self.recovery = RecoveryReport(0, 0, self._recovered, 0, 0, 0, 0, ())
            return
        try:
            self.recovery = recover_root(self._exec, self.control, verify_on_open)
            self._release_windows()  # what a crash left unpunched
            write_record(root, geometry, config, self.io_mode)  # for offline `inspect`
            if config.store.cluster_url:
                if geometry.layer_window_blocks:
                    raise ValueError(
                        f"store.cluster_url is set, but geometry {geometry.name!r} has "
                        f"sliding-window layers, which remote reads do not serve yet")
                self._cluster = StoreCluster(self._exec, self._exec.files.sessions_dir)
                self._cluster.republish(self.control)
        except BaseException:
            self._exec.close()
            raise

    def _attach(self, geometry: KVGeometry, config: FlatCakeConfig, clock: Clock,
                tenant: bytes) -> None:
        from flatcake.link.client import worker_root
        from flatcake.link.control import RemoteControl
        from flatcake.link.wire import TensorRanks

        node, timeout = config.store.node, config.store.node_timeout_s
        group = config.store.node_socket_group
        where = worker_root(node, timeout, 0, geometry, TensorRanks(), wait_s=timeout,
                            group=group)
        control = RemoteControl(node, timeout, geometry, clock,
                                name=f"FlatCakeStore pid {os.getpid()}", tenant=tenant,
                                group=group)
        # The same verbs, answered by the service.
        self.control = control  # type: ignore[assignment]
        self._remote = control
        self._recovered = control.recovered_segments
        self.config = control.config
        self.root = where.store_dir
        self._rid_prefix = f"{os.getpid()}-{id(self):x}-"
        self._exec = Executor(where.store_dir, geometry, self.config,
                              arena_path=where.arena_path)

    def _can_release(self, config: FlatCakeConfig) -> bool:
        """Whether this store punches released window rows out of its files
        (``cio.holes.releases_windows``)."""
        return releases_windows(bool(config.store.release_old_windows
                                     and self.geometry.layer_window_blocks),
                                self._exec.files.sessions_dir)

    def _release_windows(self) -> None:
        """Punch out the window rows the books released (under the lock: a later cut
        may reuse their range); attached, those the service's books released, which
        the shared files' rows of every client are."""
        if self.attached and not (self.config.store.release_old_windows
                                  and self.geometry.layer_window_blocks):
            return
        for rel in self.control.take_window_releases():
            self._exec.files.release(rel.file_id, rel.pages)

    def _wait(self) -> None:
        """Wait for a store or restore to finish (under ``self._lock``); attached, the
        one waited for may run in another process, so the books are asked again soon."""
        self._unpinned.wait(0.005 if self.attached else None)

    @classmethod
    def open(cls, root: str | os.PathLike[str], geometry: KVGeometry | str,
             config: FlatCakeConfig | None = None, *, clock: Clock | None = None,
             verify_on_open: bool = False, tenant_salt: str | bytes = b"") -> FlatCakeStore:
        """Open (or create) the store at ``root`` for blocks of ``geometry`` (a
        ``KVGeometry`` or a preset name).

        Rebuilds the index from the session files found there (restart recovery):
        torn or corrupt segments are skipped, counted in ``store.recovery``, and the
        file is cut before them. ``verify_on_open`` checks every data crc now (slow on
        big stores); otherwise data crcs are checked on every load. ``root`` wins over
        ``config.store.root``.
        """
        if isinstance(geometry, str):
            geometry = preset(geometry)
        if not isinstance(geometry, KVGeometry):
            raise ValueError(f"geometry must be a KVGeometry or a preset name, got "
                             f"{type(geometry).__name__}")
        config = config if config is not None else FlatCakeConfig()
        if not isinstance(config, FlatCakeConfig):
            raise ValueError(f"config must be a FlatCakeConfig, got {type(config).__name__}")
        return cls(Path(root).absolute(), geometry, config,
                   clock if clock is not None else WallClock(), verify_on_open, tenant_salt)

    @property
    def arena(self) -> ArenaBuffer:
        return self._exec.arena

    @property
    def reader(self) -> Reader:
        return self._exec.reader

    # -- helpers ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"store {self.root} is closed")

    @staticmethod
    def _check_keys(keys: Sequence[bytes]) -> tuple[bytes, ...]:
        if isinstance(keys, bytes | str) or not isinstance(keys, Sequence):
            raise ValueError(f"keys must be a sequence of 32-byte keys, got "
                             f"{type(keys).__name__}")
        return tuple(check_key(k, f"keys[{i}]") for i, k in enumerate(keys))

    def _paged(self, kv_caches: Sequence[torch.Tensor], block_ids: BlockIds, num_keys: int,
               unique: bool) -> tuple[PagedKV, list[int]]:
        paged = PagedKV(kv_caches, self.geometry.layer_block_bytes)
        if paged.num_layers != self.geometry.num_layers:
            raise ValueError(f"kv_caches has {paged.num_layers} layers, geometry "
                             f"{self.geometry.name!r} has {self.geometry.num_layers}")
        table = paged.block_table(block_ids, unique=False)
        if table.numel() < num_keys:
            raise ValueError(f"block_ids has {table.numel()} entries for {num_keys} keys")
        table = table[:num_keys].cpu()
        if unique:
            paged.block_table(table, unique=True)
        return paged, [int(b) for b in table.tolist()]

    def _apply(self, actions: Sequence[ReclaimAction]) -> ReclaimResult:
        """Cut, delete (or quarantine) the files the books dropped (under the lock)."""
        if self._cluster is not None:
            self._cluster.dropped(actions)
        cuts, drops = reclaim_tasks(actions)
        for cut in cuts:
            self._exec.cut(cut)
        for drop in drops:
            self._exec.drop(drop.file_id, drop.quarantine)
        return ReclaimResult(tuple(a.session_id for a in actions), len(drops),
                             sum(a.memory_bytes for a in actions),
                             sum(len(a.ssd_segments) for a in actions))

    def _settle_damage(self) -> None:
        """Apply what the books settled (under the lock): cuts before damaged segments,
        drops with quarantine where a file header is damaged (``control.damage``)."""
        self._apply_settled(settle(self.control))

    def _apply_settled(self, actions: Sequence[ReclaimAction]) -> None:
        """``_settle_damage``'s actions, settled by the books."""
        try:
            self._apply(actions)
        except OSError as exc:
            # The books are already cut; a segment left on disk fails its crc again
            # if a restart brings it back. The caller's own call is not failed.
            logger.error("sessions %s: could not cut their files on disk: %s",
                         [a.session_id for a in actions], exc)

    # -- store -----------------------------------------------------------------------

    def store_turn(self, session_id: str, keys: Sequence[bytes],
                   kv_caches: Sequence[torch.Tensor], block_ids: BlockIds,
                   signals: TurnSignals) -> StoreResult:
        """Store the blocks of ``keys`` not stored yet, from the paged KV.

        ``keys``: the request's block keys, history first (``control.keys``);
        ``block_ids[i]`` is the paged KV slot of block ``i`` (extra entries, e.g. a
        partial last block, are ignored). The new blocks are placed (memory or SSD, by
        the rule in ``signals``), gathered layer by layer, written, made durable, and
        only then published. Raises ``CapacityError`` when no medium can take them.
        """
        self._check_open()
        if not isinstance(signals, TurnSignals):
            raise ValueError(f"signals must be a TurnSignals, got {type(signals).__name__}")
        keys = self._check_keys(keys)
        paged, table = self._paged(kv_caches, block_ids, len(keys), unique=False)
        backs: list[StorePlan] = []
        try:
            return self._store_turn(session_id, keys, paged, table, signals, backs)
        finally:
            self._write_backs(backs)

    def _store_turn(self, session_id: str, keys: tuple[bytes, ...], paged: PagedKV,
                    table: list[int], signals: TurnSignals, backs: list[StorePlan]
                    ) -> StoreResult:
        """``store_turn``; the write-backs the reclaim that made room for it handed
        over go to ``backs`` (written after it)."""
        t0 = time.perf_counter()
        with self._lock:
            while True:
                begun = self._begin_store(session_id, keys, signals)
                self._apply_settled(begun.settled)
                if not begun.cut_pending:
                    break
                # The session is being cut before a damaged segment: append only after
                # the cut, right behind the last good segment (waits for the restores
                # or writes still using the cut-off part).
                self._wait()
            plan = begun.plan
            self._apply(begun.reclaimed)
            backs.extend(self._take_write_backs())
            if plan is None:
                return StoreResult(session_id, 0, len(keys), None, "", None, 0, 0, 0.0)
            # A new file is created in allocation order, before any append to it;
            # attached, an existing one may be another process's still being created:
            # waited for without the lock.
            prepared = self._prepare_file(plan, nullcontext()) \
                if plan.new_file or not self.attached else None
        if prepared is None:
            prepared = self._prepare_file(plan, self._lock)
        if isinstance(prepared, str):
            return self._failed_result(plan, prepared, t0)
        out = self._write(store_task(session_id, plan, table), paged, *prepared)
        if not out.done.ok:
            return self._failed_result(plan, out.error, t0)
        elapsed = time.perf_counter() - t0
        seg = plan.segment
        logger.debug("stored %d blocks of %r on %s (%s)", seg.num_blocks, session_id,
                     plan.medium.name, plan.placement.rule.value)
        return StoreResult(session_id, seg.num_blocks, plan.first_block, plan.medium,
                           plan.placement.rule.value, seg.base_address, seg.total_bytes,
                           out.write_calls, elapsed)

    def _write(self, task: StoreTask, paged: PagedKV | None, seq: int,
               target: OpenFile | None) -> StoreOutcome:
        """Write ``task``'s segment (``Executor.write``), then end its store in the
        books, whatever happened (and, in a cluster, publish it once durable)."""
        plan = task.plan
        ok = False
        # Attached, the memory copy is told with the completion (one call less); its
        # blocks are read from memory once the turn is durable.
        copied = threading.Event()
        try:
            out = self._exec.write(task, paged, seq, target,
                                   on_copy=copied.set if self.attached
                                   else lambda: self._copy_done(plan))
            ok = out.done.ok
            crcs = self._cluster.segment_crcs(plan.segment) if ok and self._cluster else None
        finally:
            with self._lock:
                self._end_store(plan, ok, copied.is_set())
                if ok and self._cluster is not None:  # durable and in the books: publish
                    self._cluster.publish([(plan.segment, crcs)])
                self._unpinned.notify_all()
        return out

    def _take_write_backs(self) -> list[StorePlan]:
        """(Under the lock.) The not-yet homes memory reclaim handed over to be written
        to the SSD (``placement.not_yet_write_back``); attached, none (the node
        service's books do not hand any)."""
        return [] if self.attached else self.control.take_write_backs()

    def _write_backs(self, plans: Sequence[StorePlan]) -> None:
        """Write each not-yet home of ``plans`` from its arena range to the SSD and end
        its store: once durable its home is freed (its keys pass to the SSD segment);
        a write that fails leaves the home as it was, served from memory."""
        for plan in plans:
            with self._lock:
                prepared = self._prepare_file(plan, nullcontext())
            if isinstance(prepared, str):
                logger.warning("not-yet home of session %r not written back: %s",
                               plan.session_id, prepared)
                continue
            task = StoreTask(f"write-back-{plan.segment.segment_id}", plan,
                             tuple(range(plan.segment.num_blocks)))
            out = self._write(task, None, *prepared)
            if not out.done.ok:
                logger.warning("not-yet home of session %r not written back: %s",
                               plan.session_id, out.error)

    def _begin_store(self, session_id: str, keys: Sequence[bytes], signals: TurnSignals
                     ) -> StoreBegun:
        """(Under the lock.) ``plan.requests.begin_store``; attached, one call."""
        begin: Callable[..., StoreBegun] = self._remote.begin_store \
            if self._remote is not None else functools.partial(begin_store, self.control)
        return begin(session_id, keys, turn_index=signals.turn_index,
                     context_tokens=signals.context_tokens,
                     prev_reply_tokens=signals.prev_reply_tokens,
                     shared_refcount=signals.shared_refcount)

    def _end_store(self, plan: StorePlan, ok: bool, copied: bool = False) -> None:
        """(Under the lock.) ``plan.requests.end_store``, attached one call (the service
        punches the window rows), then its file work: the released window rows punched
        out, or a failed write's allocation given back on disk (its file shrinks back
        to the books' append pointer, or goes when the books released it: a new file
        whose first write failed)."""
        if self._remote is not None:
            ended = self._remote.end_store(plan, ok, copied)
            if ended is None:  # no longer this store's (its lease ended): not touched
                return
        else:
            ended = end_store(self.control, plan, ok, copied)
        for rel in ended.releases:
            self._exec.files.release(rel.file_id, rel.pages)
        if not ok and plan.medium == Medium.SSD:
            self._exec.release(int(plan.file_id or 0), ended.file_end_bytes)

    def _prepare_file(self, plan: StorePlan, lock: AbstractContextManager[Any]
                      ) -> tuple[int, OpenFile | None] | str:
        """``Executor.prepare_file``; ENOSPC, EIO or a file not created in time fails
        the store (its error given), anything else too but is raised. ``lock``: taken
        to fail it (a null context where the caller holds ``self._lock``)."""
        try:
            return self._exec.prepare_file(plan)
        except BaseException as exc:
            with lock:
                self._end_store(plan, False)
            if isinstance(exc, OSError):
                return str(exc) or type(exc).__name__
            raise

    def _copy_done(self, plan: StorePlan) -> None:
        with self._lock:
            self.control.complete_copy(plan)

    @staticmethod
    def _failed_result(plan: StorePlan, error: str, t0: float) -> StoreResult:
        logger.warning("store of %d blocks of session %r failed: %s; they are not stored",
                       plan.segment.num_blocks, plan.session_id, error)
        return StoreResult(plan.session_id, 0, plan.first_block, None, "", None, 0, 0,
                           time.perf_counter() - t0, error=error)

    # -- lookup and load ---------------------------------------------------------------

    def lookup(self, keys: Sequence[bytes]) -> LookupResult:
        """How long a prefix of ``keys`` is stored, and where."""
        self._check_open()
        keys = self._check_keys(keys)
        with self._lock:
            hit = self.control.lookup(keys)
        return LookupResult(hit.num_blocks, hit.num_memory_blocks, hit.num_ssd_blocks)

    def prefix_owner(self, keys: Sequence[bytes]) -> tuple[int, HitOwner | None]:
        """How many leading blocks of ``keys`` are stored, and who owns the last of them
        (``HitOwner``, whichever process stored them; ``None`` for no hit or a session
        the books no longer hold): what ``control.signals.SessionTracker.resolve``
        places a turn extending ``keys`` by."""
        self._check_open()
        keys = self._check_keys(keys)
        with self._lock:
            hit = self.control.lookup(keys)
            return hit.num_blocks, hit_owner(self.control, hit)

    def load(self, keys: Sequence[bytes], kv_caches: Sequence[torch.Tensor],
             block_ids: BlockIds) -> LoadResult:
        """Restore the stored prefix of ``keys`` into the paged KV slots ``block_ids``
        (``block_ids[i]`` receives block ``i``) and wait for it."""
        return self.start_load(keys, kv_caches, block_ids).wait()

    def start_load(self, keys: Sequence[bytes], kv_caches: Sequence[torch.Tensor],
                   block_ids: BlockIds) -> LoadHandle:
        """Start restoring the stored prefix of ``keys`` (queued by FC-MAS); returns at
        once."""
        self._check_open()
        keys = self._check_keys(keys)
        paged, table = self._paged(kv_caches, block_ids, len(keys), unique=True)
        ready = LayerReady(self.geometry.num_layers)
        far: tuple[RemoteRun, ...] = ()
        if self._cluster is not None:  # the local prefix first, then the cluster's
            with self._lock:
                local = self.control.lookup(keys).num_blocks
            far = self._cluster.remote(keys, local, self.geometry.layer_block_bytes)
        with self._lock:
            found = self._servable(keys)
            if not found.wait:
                return self._start(keys, found, table, far, paged, ready)
        # Attached: a store in flight (of another process, or of a thread of this one)
        # writes the blocks right after the hit: the service answers once it is
        # durable (at most store.node_timeout_s), waited for without the lock.
        assert self._remote is not None  # only an attached store's servable waits
        self._remote.wait_servable(keys, self.config.store.node_timeout_s)
        with self._lock:
            return self._start(keys, self._servable(keys), table, far, paged, ready)

    def _servable(self, keys: tuple[bytes, ...]) -> Servable:
        """(Under the lock.) The servable hit of ``keys``; embedded, a store in flight
        of another thread that writes the blocks right after it is waited for here,
        rather than missed. Attached, one call to the service (``wait`` may be set)."""
        self._settle_damage()
        if self._remote is not None:
            return self._remote.servable(keys)
        while (found := servable(self.control, keys)).wait:
            self._unpinned.wait()
            self._settle_damage()
        return found

    def _start(self, keys: tuple[bytes, ...], found: Servable, table: list[int],
               far: tuple[RemoteRun, ...], paged: PagedKV, ready: LayerReady
               ) -> LoadHandle:
        """(Under the lock.) Pin the hit and queue its restore (FC-MAS). Attached,
        another process may reclaim the hit between the lookup and the pin (two calls):
        it is looked up again, a few times, then served as a miss."""
        hit = found.hit
        for tries in range(STALE_TRIES + 1):
            rid = f"{self._rid_prefix}load-{next(self._request_ids)}"
            try:
                task, plan = load(self.control, rid, hit, table, 0, far)
                break
            except ValueError as exc:
                if self._remote is None or STALE_HIT not in str(exc):
                    raise
                logger.debug("load %s: %s", rid, exc)
                hit = EMPTY_HIT if tries + 1 == STALE_TRIES else self._servable(keys).hit
        future = self._restores.submit(task, plan, paged, ready)
        return LoadHandle(task.remote_end, ready, future)

    def _load_finished(self, outcome: LoadOutcome, plan: LoadPlan) -> LoadResult:
        """A restore's bytes are settled (under the lock): unpin, book its damage."""
        finish_load(self.control, plan.request_id, [outcome.done])
        self._settle_damage()
        self._release_windows()
        self._unpinned.notify_all()
        loaded = outcome.done.num_blocks_loaded
        mem, ssd = by_medium(plan.hit, 0, loaded)
        res = outcome.restore
        return LoadResult(
            num_blocks=loaded, num_hit_blocks=max(plan.hit.num_blocks, outcome.done.num_blocks),
            num_memory_blocks=mem,
            num_ssd_blocks=ssd, commands=res.commands,
            memory_copies=plan.read_plan.num_copies, bytes_read=res.bytes_read,
            useful_bytes=ssd_held_bytes(plan.hit, loaded), memory_bytes=res.memory_bytes,
            damaged_segments=len(outcome.done.failed_segments), elapsed_s=res.elapsed_s,
            read_path="zero-copy" if res.zero_copy else "staging",
            staging_reason=res.zero_copy_refusal,
            num_remote_blocks=max(0, loaded - plan.hit.num_blocks),
            remote_bytes=outcome.done.remote_bytes)

    # -- reclaim, reports, lifecycle ---------------------------------------------------

    def reclaim(self) -> ReclaimResult:
        """Drop whole sessions, oldest last access first, from every medium above its
        high watermark until it is under its low watermark; delete their files."""
        self._check_open()
        with self._lock:
            self._settle_damage()
            result = self._apply(self.control.reclaim())
            backs = self._take_write_backs()
        self._write_backs(backs)
        return result

    def drop_session(self, session_id: str) -> ReclaimResult:
        """Forget a session now (it ended); refuses one a restore or write is using."""
        self._check_open()
        with self._lock:
            return self._apply([self.control.drop_session(session_id)])

    def inspect(self) -> dict[str, Any]:
        """A JSON-able snapshot: media use and watermarks, sessions, placements."""
        self._check_open()
        with self._lock:
            return snapshot(self.root, self.io_mode, self.control,
                            self.reader, self.recovery)

    def fsck(self) -> FsckReport:
        """Verify every checksum of every file under the root (writes are held off)."""
        self._check_open()
        with self._lock, self._exec.writer.lock:
            return fsck_root(self.root)

    def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Wait up to ``timeout_s`` for restores queued or in flight, then close every
        file (``Executor.close``, within what is left of the deadline). Restores left
        at the deadline end as misses: their ``wait`` reports no block loaded, and a
        restore still reading keeps its window and files (the process is ending); its
        late bytes are never reported, and its fence keeps them out of the caller's
        tensors (``Restores.abandon``; a zero-copy read already with the disk excepted).
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        t0 = time.monotonic()
        if self._restores.wait_idle(timeout_s):
            left = self._restores.abandon()
            if left:
                logger.warning("FlatCake store %s closed with %d restores unfinished after "
                               "%.1f s: misses, nothing of them is reported loaded",
                               self.root, left, timeout_s)
        if self._cluster is not None:
            self._cluster.close()
        self._exec.close(timeout_s=max(timeout_s - (time.monotonic() - t0), 0.0))
        if self.attached:
            self.control.close()  # type: ignore[attr-defined]

    def __enter__(self) -> FlatCakeStore:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"FlatCakeStore(root={str(self.root)!r}, geometry={self.geometry.name!r}, "
                f"io_mode={self.io_mode!r})")
