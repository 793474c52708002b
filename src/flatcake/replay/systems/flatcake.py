"""FlatCake in the simulator: the real control plane on the simulated clock.

Everything that decides is FlatCake's own code, unchanged: ``ControlPlane`` (block
index lookups by runs, write-time placement with ``decide_placement``, host-arena and
session-file allocation, per-session reclaim with ``choose_victims``) and, per worker,
the request driver the store and the vLLM connector run on (``plan.driver``: a
request's phases, one transition table) over that worker's FC-MAS queue (ready queue +
SSD-preparing queue with ``1 + wait/kv`` priority and a bounded number of restores in
flight that wait, never cancel; or the one-FIFO ablation). Only the devices are models:

* a restore reads its SSD part with the commands of the plan the store and the vLLM
  connector execute (``plan.bulk.stream_totals``, the bulk twin of
  ``plan.stream.StreamPlanner``: each SSD segment read over its wanted blocks) on the
  worker's SSD channel, straight into the GPU through the two-layer window (no host
  staging), and copies its memory part over the host->GPU link;
* a restore that fills memory copies (``placement.copy_on_restore``) ends later by
  the copy's pipeline (``refill_wait_s``): the request and the restore's in-flight slot
  wait for it, as in the executor;
* a request whose missing blocks are all in memory runs at once; its memory copy
  overlaps its prefill;
* a finished turn's new blocks are placed and allocated by ``prepare_store``; a memory
  segment is published at once, an SSD segment after its write occupies the worker's
  SSD channel (``complete_store``); its memory copy, if the control plane made one, is
  readable at once (``complete_copy``);
* the request protocol is the store's and the connector's (``plan.requests``): a
  request whose prefix continues into a segment still being written, past what its GPU
  holds, waits for that write and then looks up again (``servable``; the connector's
  ``get_num_new_matched_tokens`` answers "ask again next step" then), instead of
  recomputing blocks that are about to be durable; FC-MAS weighs a restore by
  ``ControlPlane.restore_request``.

Every request goes through its worker's driver: admitted and submitted to FC-MAS as it
looks up (at its arrival time; a request with nothing to load, or whose SSD part loads
with its prefill, waits in the ready queue), started when FC-MAS gives its SSD restore a
slot or lets it out of the ready queue, reported when its restore or its prefill's load
ends, released (a restore: when it leaves the ready queue) and finished with its turn.

Keys: dense block ids map to 32-byte keys (the id, little endian, in the first 8
bytes); a session is ``str(session index)``. The placement signals come from the
classes the vLLM connector uses (``control.signals``): ``SessionTracker`` gives the
turn index and the previous reply (a trace's chain is the conversation, so a sub-agent
counts its own turns while its blocks live in its session's files), and
``PrefixRefcount`` counts the requests holding each block from prefill start to
completion. A global-clock trace has no sessions: the tracker infers them as the
connector does without a ``session_id`` (a request that extends the conversation owning
the end of its hit continues it, a branch of it joins it up to the branch cap, a miss
starts its own).

The pure arithmetic (keys of dense ids, hit runs, the refill pipeline) is in
``systems.keys``; what a read plan and a segment write cost on the node's devices, in
``systems.devio``.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable
from typing import Any

from flatcake.config import FlatCakeConfig
from flatcake.control import ControlPlane, StorePlan
from flatcake.control.address import Medium
from flatcake.control.index import PrefixHit, trim_hit
from flatcake.control.scheduler import RestoreRequest
from flatcake.control.signals import (
    PrefixRefcount,
    SessionTracker,
    TurnInfo,
    hit_owner,
    max_branch_blocks,
)
from flatcake.control.types import LoadPlan
from flatcake.control.windows import delivered_bytes, restore_view
from flatcake.errors import CapacityError
from flatcake.geometry import KVGeometry
from flatcake.plan.bulk import SegmentCache, stream_totals
from flatcake.plan.driver import RequestDriver, Tracked
from flatcake.plan.requests import servable, settle
from flatcake.readplan import ReadPlan
from flatcake.replay.node.node import Node, Request, System, Worker, not_attached
from flatcake.replay.systems.devio import charge_plan, write_segment
from flatcake.replay.systems.keys import keys_of, make_keys, memory_run
from flatcake.replay.systems.layers import LayerBooks, stored_layers
from flatcake.replay.systems.state import FcSharing, FcState

logger = logging.getLogger(__name__)


class FlatCakeSystem(System):
    """``flatcake`` (two queues) and ``flatcake-1q`` (``single_queue=True``).
    ``sharing``: in a cluster that shares KV, builds the part that reads the blocks
    other nodes hold (given this system)."""

    def __init__(self, config: FlatCakeConfig, name: str = "flatcake",
                 sharing: Callable[[FlatCakeSystem], FcSharing] | None = None) -> None:
        super().__init__()
        self.name = name
        self.config = config
        self.sharing = sharing(self) if sharing is not None else None
        self.cp: ControlPlane | None = None
        # Per worker: its requests, through their phases over its FC-MAS queue.
        self.drivers: list[RequestDriver[Request, int]] = []
        self.keys: list[bytes] = []
        self.sessions = SessionTracker()
        self.refcount = PrefixRefcount()
        self.num_store_rejected = 0
        self.num_reclaim_actions = 0
        self.num_store_waits = 0
        self.read_gap_bytes = 0
        self.read_check_bytes = 0
        self.window_bytes_released = 0
        # Requests waiting for a store in flight, by the key their hit stopped at.
        self.waiters: dict[bytes, list[Request]] = {}
        # Static geometry of live segments for the planner (ids are never reused).
        self.segment_cache: SegmentCache = {}
        self.planner = functools.partial(stream_totals, segment_cache=self.segment_cache)
        self.books: LayerBooks | None = None  # per layer kind: bytes written, commands
        self.geometry: KVGeometry | None = None  # the layers the store holds

    def attach(self, node: Node) -> None:
        super().attach(node)
        clock = node.loop.clock
        # As the vLLM connector: the layer kinds the engine does not prefix-cache are not
        # stored, restored, nor cut a hit back (the engine rebuilds them).
        geometry, stored = stored_layers(node.geometry, node.spec.uncached_kinds)
        self.geometry = geometry
        # As the store: once a newer turn is durable, the older turns' window rows no
        # next turn reads are released (the replay punches nothing; it counts them).
        self.cp = ControlPlane(geometry, self.config, clock, release_windows=True,
                               write_backs=True)
        self.books = LayerBooks(node.geometry, stored)
        self.drivers = [RequestDriver(self.cp, queue=w.idx) for w in node.workers]
        if len(self.keys) != node.wl.num_ids:  # a cluster's nodes share one key list
            self.keys = make_keys(node.wl.num_ids)
        # Every session has a request, so nothing is evicted; ids count up (runs repeat).
        ids = itertools.count()
        self.sessions = SessionTracker(max_sessions=max(node.wl.num_requests, 1),
                                       new_session_id=lambda: f"auto-{next(ids)}",
                                       max_branch_blocks=max_branch_blocks(
                                           self.config.placement, geometry))
        self.refcount = PrefixRefcount()

    # ---- arrival ------------------------------------------------------------------
    def on_arrival(self, req: Request) -> None:
        node, cp = self.node, self.cp
        if node is None or cp is None:
            raise not_attached(self.name)
        w = node.workers[req.worker]
        keys = keys_of(self.keys, req.runs)
        g = w.gpu.prefix_hits(req.runs)
        found = servable(cp, keys, g)
        hit = found.hit
        if found.wait:  # looks up again when the write is durable
            self.waiters.setdefault(keys[hit.num_blocks], []).append(req)
            self.num_store_waits += 1
            return
        if (hit.num_blocks < len(keys) and self.sharing is not None
                and self.sharing.arrive(req, keys, hit, g)):
            return
        st = FcState(hit, keys, self.turn(req, hit.num_blocks, hit))
        req.sys = st
        if hit.num_blocks <= g:
            self.submit(req, RestoreRequest(req.idx, req.arrival_s, 0, False))
            node.make_ready(req)
            return
        if g == 0:
            part = hit
            ssd_blocks = hit.num_ssd_blocks
        else:
            runs = trim_hit(hit, g)
            ssd_blocks = sum(r[2] for r in runs if r.segment.medium is Medium.SSD)
            part = PrefixHit(hit.num_blocks - g, hit.num_blocks - g - ssd_blocks, ssd_blocks,
                             runs)
        needs_ssd = ssd_blocks > 0
        lp = cp.prepare_load(req.idx, part, planner=self.planner, refill=True)
        if lp.refills:
            st.refills = tuple(home.segment_id for home, _ in lp.refills)
            st.refill_bytes = sum(copy.total_bytes for _, copy in lp.refills)
        st.load_pinned = True
        st.gpu_prefix = g
        st.plan = lp.read_plan
        if not needs_ssd:
            self.submit(req, RestoreRequest(req.idx, req.arrival_s, 0, False), lp)
            node.make_ready(req)
            return
        st.needs_ssd = True
        if node.spec.ssd_loads_in_step:  # the engine schedules it; it loads with the prefill
            st.in_step = True
            self.submit(req, RestoreRequest(req.idx, req.arrival_s, 0, False), lp)
            node.make_ready(req)
            return
        self.submit(req, cp.restore_request(req.idx, req.arrival_s, lp), lp)
        self.pump(req.worker)

    def submit(self, req: Request, request: RestoreRequest, plan: LoadPlan | None = None
               ) -> None:
        """Admit ``req`` to its worker's driver and queue it in FC-MAS as ``request``
        (weighed here: at its arrival time; see the module docstring)."""
        driver = self.drivers[req.worker]
        driver.submit(driver.admit(req.idx, req), request, plan)

    def tracked(self, req: Request) -> Tracked[Request, int]:
        """``req`` as its worker's driver holds it."""
        t = self.drivers[req.worker].get(req.idx)
        if t is None:
            raise ValueError(f"request {req.idx} is not held by worker {req.worker}'s "
                             "request driver")
        return t

    def turn(self, req: Request, num_blocks: int, hit: PrefixHit) -> TurnInfo:
        """The request's turn in its session, given ``num_blocks`` hit (``hit``: this
        store's own part, whose owner a trace without sessions joins)."""
        if self.cp is None:
            raise not_attached(self.name)
        if req.session >= 0:
            return self.sessions.resolve(f"chain-{req.chain}", num_blocks, None)
        return self.sessions.resolve(None, num_blocks, hit_owner(self.cp, hit))

    def pump(self, worker: int) -> None:
        node = self.node
        if node is None:
            raise not_attached(self.name)
        for t in self.drivers[worker].start_restores():
            req = t.books
            req.restore_start_s = node.now
            node.admit_or_wait(req, self._start_restore)

    def _start_restore(self, req: Request) -> None:
        node = self.node
        if node is None:
            raise not_attached(self.name)
        if self.sharing is not None and self.sharing.start(req):
            return
        end, useful = self._read(req, node.workers[req.worker])
        # Fixed cost of a restore (lookup, submission, completion), same for every system.
        node.loop.at(end + node.spec.restore_overhead_s, self.restore_done, (req, useful))

    def _read(self, req: Request, w: Worker) -> tuple[float, int]:
        """Charge the reads of ``req``'s hit beyond its GPU prefix; when they end and
        the SSD bytes the request needs."""
        node = self.node
        if node is None:
            raise not_attached(self.name)
        st: FcState = req.sys
        g = req.gpu_prefix
        plan = st.plan
        runs = trim_hit(st.hit, g) if g else st.hit.runs
        if plan is None or g != st.gpu_prefix:
            # The GPU prefix changed while the request waited: plan what is missing now.
            plan = stream_totals(restore_view(runs), (self.geometry or node.geometry).num_layers,
                                 self.config.planner, segment_cache=self.segment_cache)
        # Useful: the SSD bytes the request needs, its history blocks and the windows
        # its next step attends to (the plan also reads the rest of their segments, for
        # the checksum).
        useful = delivered_bytes(runs, st.hit.num_blocks)
        # Where the rest of the bytes read go: 4 KiB alignment padding and holes read
        # through (the plan's gap bytes), and the segments' other blocks (checksums).
        self.read_gap_bytes += plan.gap_bytes
        self.read_check_bytes += plan.useful_bytes - useful
        if self.books is not None:
            self.books.read_plan(plan)
        st.plan = None
        end = self.charge(w, plan, st.refill_bytes)
        req.restore_blocks = max(st.hit.num_blocks - g, 0)
        return end, useful

    def charge(self, w: Worker, plan: ReadPlan, refill_bytes: int = 0) -> float:
        """Put ``plan``'s reads on ``w``'s devices (``devio.charge_plan``); returns when
        they and the ``refill_bytes`` of memory copies the restore fills are done."""
        node = self.node
        if node is None:
            raise not_attached(self.name)
        return charge_plan(node, w, plan, refill_bytes, (self.geometry or node.geometry).num_layers)

    def restore_done(self, arg: tuple[Request, int]) -> None:
        req, useful = arg
        node, cp = self.node, self.cp
        if node is None or cp is None:
            raise not_attached(self.name)
        req.restore_end_s = node.now
        node.rec.prefetch_s.append(node.now - req.arrival_s)
        node.rec.ssd_useful_bytes += useful
        self.drivers[req.worker].reported(self.tracked(req))  # gives its slot back
        self._release(req)
        self.pump(req.worker)
        node.make_ready(req)

    def _release(self, req: Request) -> None:
        """Unpin what the restore read."""
        if self.cp is None:
            raise not_attached(self.name)
        if self.sharing is not None and self.sharing.release(req):
            return
        # The restored bytes filled the memory copies the plan asked for (their time is
        # in the restore's end, ``refill_wait_s``).
        self.cp.complete_load(req.idx, req.sys.refills)
        req.sys.load_pinned = False
        self.settle_books()

    def settle_books(self) -> None:
        """What the books settled once a load or a write ended (``plan.requests``): the
        replay reads no bytes, so damage only comes from ``mark_damaged`` (a test's),
        and the actions free nothing on a device."""
        if self.cp is not None:
            self.num_reclaim_actions += len(settle(self.cp))

    # ---- ready / prefill ----------------------------------------------------------
    def pop_ready(self, worker: Worker) -> Request | None:
        t = self.drivers[worker.idx].pop_next()
        return None if t is None else t.books

    def prefill_load(self, req: Request, worker: Worker) -> tuple[int, float]:
        node, cp = self.node, self.cp
        if node is None or cp is None:
            raise not_attached(self.name)
        st: FcState = req.sys
        # It left the ready queue (started); its load, if any, runs with its prefill:
        # reported (and released) now.
        self.drivers[worker.idx].reported(self.tracked(req))
        if not st.load_pinned:
            return 0, 0.0
        if st.in_step:
            return self._load_in_step(req, worker)
        n = memory_run(st.hit, req.gpu_prefix)
        cp.complete_load(req.idx)
        st.load_pinned = False
        self.settle_books()
        if n == 0:
            return 0, 0.0
        nbytes = n * node.block_bytes
        now = node.now
        end = worker.link.submit(now, nbytes / node.spec.host_to_gpu_bytes_per_s, nbytes)
        return n, end - now

    def _load_in_step(self, req: Request, worker: Worker) -> tuple[int, float]:
        """An SSD hit loaded in the step that prefills it: the reads start now and the
        forward waits for each layer (``req.load_layers``); the restore's fixed cost is
        spread with them."""
        node = self.node
        if node is None:
            raise not_attached(self.name)
        end, useful = self._read(req, worker)
        node.rec.prefetch_s.append(node.now - req.arrival_s)
        node.rec.ssd_useful_bytes += useful
        self._release(req)
        req.load_layers = (self.geometry or node.geometry).num_layers
        return req.restore_blocks, end - node.now + node.spec.restore_overhead_s

    def on_prefill_start(self, req: Request) -> None:
        self.refcount.add(req.idx, req.sys.keys)

    # ---- store --------------------------------------------------------------------
    def on_complete(self, req: Request) -> None:
        node, cp = self.node, self.cp
        if node is None or cp is None:
            raise not_attached(self.name)
        self.drivers[req.worker].finish(req.idx)
        st: FcState = req.sys
        turn = st.turn
        # The prompt's full blocks, as the connector counts them: a trace's partial last
        # block is re-hashed once the next turn fills it, so a continuation never hits it.
        full_blocks = req.full_blocks
        self.sessions.finish_turn(turn, req.output_tokens, full_blocks)
        if full_blocks == 0:
            self.refcount.remove(req.idx)
            st.keys = ()
            return
        # A trace's session owns the files of all its chains (sub-agents included).
        sid = str(req.session) if req.session >= 0 else turn.session_id
        # As the connector does: the request's full blocks from its first; prepare_store
        # writes those the books do not hold (also blocks dropped since the request
        # arrived, so the new segment is never cut off from its prefix, and blocks it
        # fetched from other nodes: this node then holds the whole prefix). A partial
        # last block is not stored: no later request shares its key, and a segment
        # ending on it would hold its windows where no hit can end.
        keys = st.keys[:full_blocks]
        refcount = self.refcount

        def shared(i: int) -> int:
            """Live requests holding the first block written (``keys[i]``), this one
            included."""
            return refcount.refcount(keys[i], i)

        try:
            plan = cp.prepare_store(sid, keys, turn_index=turn.turn_index,
                                    context_tokens=req.input_tokens,
                                    prev_reply_tokens=turn.prev_reply_tokens,
                                    shared_refcount=shared)
        except CapacityError:
            self.num_store_rejected += 1
            self._write_backs(req)
            return
        finally:
            refcount.remove(req.idx)
            st.keys = ()
        self.num_reclaim_actions += len(cp.take_reclaim_actions())
        self._write_backs(req)
        if plan is None:
            return
        if plan.medium == Medium.MEMORY:
            cp.complete_store(plan, True)
            return
        if plan.copy is not None:
            cp.complete_copy(plan)  # in host memory now; the SSD write follows
        if self.books is not None:
            self.books.wrote(plan.segment.layout)
        end = write_segment(node, node.workers[req.worker], plan.segment.total_bytes,
                            self.config.planner.max_read_bytes)
        node.loop.at(end, self._store_done, plan)

    def _write_backs(self, req: Request) -> None:
        """Not-yet homes reclaim hands to the SSD (``placement.not_yet_write_back``):
        written from host memory on the request's worker, as a store is."""
        node, cp = self.node, self.cp
        if node is None or cp is None:
            raise not_attached(self.name)
        for plan in cp.take_write_backs():
            if self.books is not None:
                self.books.wrote(plan.segment.layout)
            end = write_segment(node, node.workers[req.worker], plan.segment.total_bytes,
                                self.config.planner.max_read_bytes)
            node.loop.at(end, self._store_done, plan)

    def _store_done(self, plan: StorePlan) -> None:
        if self.cp is None:
            raise not_attached(self.name)
        self.cp.complete_store(plan, True)
        # Older turns' window rows this turn superseded (the store punches them out).
        self.window_bytes_released += sum(r.bytes for r in self.cp.take_window_releases())
        self.settle_books()
        if self.waiters:
            for key in plan.segment.keys:
                for req in self.waiters.pop(key, ()):
                    self.on_arrival(req)

    def extra_metrics(self) -> dict[str, Any]:
        if self.cp is None:
            raise not_attached(self.name)
        st = self.cp.stats()
        return {
            "placements": dict(st.placements_by_rule),
            "sessions_reclaimed_memory": st.sessions_reclaimed_memory,
            "sessions_reclaimed_ssd": st.sessions_reclaimed_ssd,
            "stores_rejected": self.num_store_rejected,
            "store_waits": self.num_store_waits,
            "ssd_gap_bytes": self.read_gap_bytes,
            "ssd_checksum_bytes": self.read_check_bytes,
            "memory_copies_made": st.memory_copies_made,
            "memory_copies_dropped": st.memory_copies_dropped,
            "memory_used_bytes": st.memory_used_bytes,
            "ssd_used_bytes": st.ssd_used_bytes,
            "ssd_never_read_bytes": st.ssd_dropped_unread_bytes + st.ssd_unread_bytes,
            **(self.books.metrics() if self.books is not None else {}),
            "ssd_window_bytes_released": self.window_bytes_released,
            **(self.sharing.metrics() if self.sharing is not None else {}),
        }
