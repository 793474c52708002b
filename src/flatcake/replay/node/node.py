"""The simulated serving node: workers, the request lifecycle, and the ``System`` hooks.

A node has ``num_workers`` data-parallel GPUs. Each worker runs one engine: a KV pool
with the engine's own LRU prefix cache, one prefill at a time, continuous-batching
decode. A *system* (FlatCake, a tiered store, memory only) decides what is loaded from
host memory and SSD, when, and where finished turns are stored. Request life::

    arrive ──► system.on_arrival ──┬─ nothing to restore ───────────────► ready
                                   └─ restore (host/SSD -> GPU) ─ done ─► ready
    ready ──► (worker idle, GPU pool admits it) prefill ──► first token ──► decode
          ──► done: system.on_complete (store) ──► the chain's next request arrives
              think_s later (capped; see ``replay.node.arrivals`` for when sessions start)

Prefill and decode share the GPU: a prefill starts after the decode step in progress
(one step's time is added to it when a batch is decoding), and every sequence decoding
on that worker is held back by the prefill's duration (no chunked prefill; SGLang and
vLLM run a prefill batch between decode steps).

GPU pool accounting (per worker, in blocks): a request admitted to the pool pins the
blocks it shares with the prefix cache, inserts its other input blocks (restored or to
be computed) and reserves its output blocks. Admission evicts unpinned cached blocks,
least recently used first; when even that is not enough the request waits until a
running request finishes. Requests that restore are admitted before their restore
starts (the data lands in their GPU blocks); the others when their prefill starts.

Hits: ``hit_blocks`` is the run of input blocks present in the GPU when the prefill
starts: the prefix-cache hit at admission plus the blocks restored or loaded for it.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from flatcake import progress
from flatcake.geometry import KVGeometry
from flatcake.replay.node.arrivals import session_schedule, window_rate
from flatcake.replay.node.clock import EventLoop
from flatcake.replay.node.devices import NodeSpec, layered_s
from flatcake.replay.node.metrics import Recorder
from flatcake.replay.node.parts import (  # noqa: F401  (re-exported)
    ArrivalQueue,
    Request,
    Worker,
)
from flatcake.replay.workload.runs import Runs, slice_runs
from flatcake.replay.workload.trace import Workload

logger = logging.getLogger(__name__)

_PROGRESS_SLICE_S = 60.0
"""Simulated seconds between progress-bar updates (only when a bar is shown)."""




def not_attached(system: str) -> ValueError:
    """The error a system raises when it is driven before ``attach`` gave it a node."""
    return ValueError(f"system {system!r} is not attached to a node (call attach first)")


class System(ABC):
    """What differs between FlatCake and its baselines.

    Contract: called from the node's event loop only. ``on_arrival`` must eventually
    make the request ready through ``node.make_ready`` (at once, or when a restore ends);
    ``pop_ready`` hands the worker its next ready request; ``prefill_load`` is asked at
    prefill start of a request that did not restore (what else can be loaded, and how
    long the copy takes); ``on_complete`` stores the finished turn.
    """

    name = "system"

    def __init__(self) -> None:
        self.node: Node | None = None

    def attach(self, node: Node) -> None:
        self.node = node

    @abstractmethod
    def on_arrival(self, req: Request) -> None: ...

    @abstractmethod
    def pop_ready(self, worker: Worker) -> Request | None: ...

    def prefill_load(self, req: Request, worker: Worker) -> tuple[int, float]:
        """Blocks loaded right after the GPU prefix at prefill start, and the copy time
        (overlapped with compute). Default: nothing."""
        return 0, 0.0

    def on_prefill_start(self, req: Request) -> None:  # noqa: B027 - optional hook
        """Called once the hit is final, before compute."""

    @abstractmethod
    def on_complete(self, req: Request) -> None: ...

    def extra_metrics(self) -> dict[str, Any]:
        return {}


class Node:
    """One replay run of ``workload`` on ``spec`` with ``system`` at ``rate_req_s``."""

    def __init__(self, workload: Workload, system: System, spec: NodeSpec,
                 geometry: KVGeometry, rate_req_s: float, seed: int = 0,
                 think_cap_s: float = math.inf, loop: EventLoop | None = None,
                 rec: Recorder | None = None) -> None:
        if not rate_req_s > 0:
            raise ValueError(f"rate_req_s must be > 0, got {rate_req_s!r}")
        if geometry.tokens_per_block != workload.block_tokens:
            raise ValueError(
                f"geometry.tokens_per_block={geometry.tokens_per_block} differs from the "
                f"trace's block size {workload.block_tokens}")
        self.wl = workload
        self.spec = spec
        self.geometry = geometry
        self.block_bytes = geometry.history_block_bytes  # a window's few blocks left out
        self.kv_bytes_per_token = self.block_bytes // geometry.tokens_per_block
        self.rate_req_s = float(rate_req_s)
        self.seed = int(seed)
        self.think_cap_s = float(think_cap_s)
        self.think_s = workload.think_s
        self.offered_req_s = math.nan
        self.offer_unreachable = False
        # A cluster (``replay.cluster``) runs its nodes on one loop and one recorder.
        self.loop = loop if loop is not None else EventLoop()
        self.cluster: Any = None  # set by the cluster: routes arrivals between nodes
        cap_blocks = spec.gpu.kv_capacity_bytes // self.block_bytes
        self.workers = [Worker(i, workload.num_ids, cap_blocks) for i in range(spec.num_workers)]
        self.rec = rec if rec is not None else Recorder(workload.num_requests,
                                                        spec.num_workers)
        self.seen = np.zeros(workload.num_ids, dtype=bool)
        # The turn-end bound: with a sliding window the engine prefix-caches, a hit can
        # end only where the window is held; an infinite store holding it at each
        # earlier request's last full block (a turn's end) hits up to the last of those.
        windows = geometry.layer_window_blocks or (0,) * geometry.num_layers
        kinds = [grp.kind for grp in geometry.layer_groups for _ in range(grp.num_layers)]
        self.turn_ends = np.zeros(workload.num_ids if any(
            w and kind not in spec.uncached_kinds for w, kind in zip(windows, kinds, strict=True))
            else 0, dtype=bool)
        self.session_worker = np.full(max(workload.num_sessions, 1), -1, dtype=np.int32)
        self.session_open = np.zeros(max(workload.num_sessions, 1), dtype=np.int32)
        self.system = system
        self.num_done = 0
        self.num_arrived = 0
        self._rr = -1
        system.attach(self)

    # ---- time --------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.loop.clock.now()

    # ---- load --------------------------------------------------------------------
    def _schedule_arrivals(self) -> None:
        wl = self.wl
        if wl.global_clock:
            # Recorded timestamps, scaled so the measured window offers the rate.
            t = wl.time_s - (wl.time_s.min() if len(wl.time_s) else 0.0)
            own = window_rate(t) if len(t) > 1 else math.nan
            if len(t) <= 1:
                times = t
            elif math.isfinite(own) and own > 0:
                times = t * (own / self.rate_req_s)
            else:  # every request at one instant: Poisson arrivals at the rate
                rng = np.random.default_rng(self.seed)
                times = np.cumsum(rng.exponential(1.0 / self.rate_req_s, len(t)))
            self.offered_req_s = window_rate(times) if len(times) > 1 else self.rate_req_s
            for i in np.argsort(times, kind="stable"):
                self.loop.at(float(times[i]), self._arrive_global, int(i))
            return
        sched = session_schedule(wl, self.rate_req_s, self.think_cap_s, self.spec.gpu,
                                 self.kv_bytes_per_token, self.seed)
        self.think_s = sched.think_s
        self.offered_req_s = sched.offered_req_s
        self.offer_unreachable = sched.unreachable
        self.session_start_s = sched.session_start_s
        for c in range(wl.num_chains):
            first = int(wl.chain_req[wl.chain_ptr[c]])
            self.loop.at(float(sched.chain_start_s[c]), self._arrive_chain, first)

    def _arrive_chain(self, i: int) -> None:
        (self if self.cluster is None else self.cluster.route(i))._arrive(i)

    def _arrive_global(self, i: int) -> None:
        (self if self.cluster is None else self.cluster.route(i))._arrive(i)

    def _arrive(self, i: int) -> None:
        wl = self.wl
        runs = wl.runs(i)
        req = Request(i, runs, self.now, wl)
        self.num_arrived += 1
        # Infinite-cache bound: the run of blocks seen by any earlier request.
        seen = self.seen
        hit = 0
        for s, e in runs:
            seg = seen[s:e]
            if np.count_nonzero(seg) == e - s:
                hit += e - s
                continue
            hit += int(np.argmin(seg))
            break
        for s, e in runs:
            seen[s:e] = True
        self.rec.max_hit_blocks[i] = hit
        self.rec.turn_end_hit_blocks[i] = self._turn_end_hit(runs, hit, req.full_blocks)
        self.rec.num_blocks[i] = req.num_blocks
        self.rec.arrival_s[i] = req.arrival_s
        req.worker = self._route(req)
        w = self.workers[req.worker]
        w.outstanding += 1
        w.queue.change(self.now, 1)
        self.system.on_arrival(req)

    def _turn_end_hit(self, runs: Runs, hit: int, full_blocks: int) -> int:
        """The turn-end bound's hit of a request over ``runs`` whose infinite-cache hit
        is ``hit`` blocks: the last position up to ``hit`` where an earlier request's
        full blocks ended (``hit`` itself without a cached window); then marks this
        request's own end."""
        ends = self.turn_ends
        if not len(ends):
            return hit
        got = at = 0
        for s, e in slice_runs(runs, 0, hit):
            last = np.flatnonzero(ends[s:e])
            if len(last):
                got = at + int(last[-1]) + 1
            at += e - s
        if full_blocks:
            ((s, _e),) = slice_runs(runs, full_blocks - 1, full_blocks)
            ends[s] = True
        return got

    def _route(self, req: Request) -> int:
        routing = self.spec.routing
        if routing == "round_robin":
            self._rr = (self._rr + 1) % len(self.workers)
            return self._rr
        s = req.session
        if routing == "session" and s >= 0:
            w = int(self.session_worker[s])
            if w < 0:
                w = min(range(len(self.workers)),
                        key=lambda k: (self.workers[k].num_sessions, self.workers[k].outstanding,
                                       k))
                self.session_worker[s] = w
                self.workers[w].num_sessions += 1
            return w
        # Cache-aware: the worker whose prefix cache holds the longest prefix, then the
        # least loaded.
        best = 0
        best_key: tuple[int, int, int] | None = None
        for k, wk in enumerate(self.workers):
            key = (-wk.gpu.prefix_hits(req.runs), wk.outstanding, k)
            if best_key is None or key < best_key:
                best, best_key = k, key
        return best

    # ---- GPU pool ----------------------------------------------------------------
    def out_blocks(self, req: Request) -> int:
        return -(-req.output_tokens // self.geometry.tokens_per_block)

    def admit(self, req: Request) -> bool:
        """Reserve the request's blocks in its worker's GPU pool (see module docstring).

        Sets ``req.gpu_prefix``. Returns False (nothing changed) when it cannot fit even
        after evicting every unpinned cached block."""
        w = self.workers[req.worker]
        gpu = w.gpu
        runs = req.runs
        present, prefix = gpu.presence(runs)
        out_blocks = self.out_blocks(req)
        need = (req.num_blocks - present) + out_blocks
        free = gpu.capacity_blocks - gpu.size - w.reserved_blocks
        if need > free:
            # Protect this request's own cached blocks while making room.
            gpu.pin(runs)
            evicted = gpu.drop(need - free)  # every system drops GPU evictions
            self.rec.gpu_evicted_blocks += evicted
            free += evicted
            if need > free:
                for s, e in runs:
                    gpu.pins[s:e] -= 1
                return False
            gpu.touch(runs)  # the request keeps the pin it took
        else:
            gpu.touch_pin(runs)
        req.gpu_prefix = prefix  # eviction spared this request's own (pinned) blocks
        w.reserved_blocks += out_blocks
        req.admitted = True
        return True

    def admit_or_wait(self, req: Request, then: Any) -> None:
        """Admit now and call ``then(req)``, or queue until GPU memory frees."""
        w = self.workers[req.worker]
        if not w.waiting_admit and self.admit(req):
            then(req)
            return
        w.waiting_admit.append((req, then))

    def _retry_admissions(self, w: Worker) -> None:
        while w.waiting_admit:
            req, then = w.waiting_admit[0]
            if not self.admit(req):
                return
            w.waiting_admit.pop(0)
            then(req)

    # ---- ready / prefill ---------------------------------------------------------
    def make_ready(self, req: Request) -> None:
        """The system calls this when ``req`` may run (its restore, if any, is done)."""
        req.ready_s = self.now
        self.kick(self.workers[req.worker])

    def kick(self, w: Worker) -> None:
        """Start the next prefill on ``w`` if its prefill server is idle.

        The next request in the system's order runs if it fits the GPU pool; one that
        does not is held (keeping its place) and later ones may pass it, so requests
        already holding their memory (restored ones) can always drain the pool."""
        if w.busy:
            return
        for k, req in enumerate(w.held):
            if self._try_prefill(req, w):
                del w.held[k]
                return
        while True:
            nxt = self.system.pop_ready(w)
            if nxt is None:
                return
            if self._try_prefill(nxt, w):
                return
            w.held.append(nxt)

    def _try_prefill(self, req: Request, w: Worker) -> bool:
        if not req.admitted:
            if not self.admit(req):
                return False
            n, load_s = self.system.prefill_load(req, w)
            req.restore_blocks = n
            req.load_s = load_s
        self._start_prefill(req, w)
        return True

    def _start_prefill(self, req: Request, w: Worker) -> None:
        w.busy = True
        now = self.now
        w.queue.change(now, -1)
        w.gpu_busy.hold(now)
        req.prefill_start_s = now
        hit = min(req.gpu_prefix + req.restore_blocks, req.num_blocks)
        req.hit_blocks = hit
        self.system.on_prefill_start(req)
        bt = self.geometry.tokens_per_block
        cached_tokens = min(hit * bt, req.input_tokens)
        new_tokens = req.input_tokens - cached_tokens
        compute_s = self.spec.gpu.prefill_time_s(new_tokens, cached_tokens)
        # The decode step in progress finishes first.
        step_s = self.spec.gpu.decode_step_s(w.decoding, w.decode_kv_bytes) \
            if w.decoding else 0.0
        if req.load_layers:  # loaded in this step, layer by layer with the forward
            wall = layered_s(req.load_s, compute_s, req.load_layers, step_s)
        else:
            wall = max(compute_s + step_s, req.load_s)
        w.stall_s += wall  # the decode batch waits for this prefill
        rec = self.rec
        rec.hit_blocks[req.idx] = hit
        rec.recomputed_tokens += max(0, min(int(rec.max_hit_blocks[req.idx]) * bt,
                                            req.input_tokens) - cached_tokens)
        rec.prefill_tokens += new_tokens
        self.loop.after(wall, self._prefill_done, req)

    def _prefill_done(self, req: Request) -> None:
        w = self.workers[req.worker]
        now = self.now
        req.first_token_s = now
        self.rec.first_token_s[req.idx] = now
        w.busy = False
        w.gpu_busy.release(now)
        # Join the decode batch; its step time is taken at join time.
        kv = req.input_tokens * self.kv_bytes_per_token
        if w.decoding == 0:
            w.gpu_busy.hold(now)
        req.decode_stall_s = w.stall_s
        w.decoding += 1
        w.decode_kv_bytes += kv
        step = self.spec.gpu.decode_step_s(w.decoding, w.decode_kv_bytes)
        self.loop.after(max(req.output_tokens - 1, 0) * step, self._done, req)
        self.kick(w)

    def _done(self, req: Request) -> None:
        w = self.workers[req.worker]
        now = self.now
        held = w.stall_s - req.decode_stall_s
        if held > 0:
            # Prefills ran on this GPU while the request decoded: it finishes later.
            req.decode_stall_s = w.stall_s
            self.loop.after(held, self._done, req)
            return
        req.done_s = now
        self.rec.done_s[req.idx] = now
        w.decoding -= 1
        if w.decoding == 0:
            w.gpu_busy.release(now)
        w.decode_kv_bytes -= req.input_tokens * self.kv_bytes_per_token
        w.gpu.unpin(req.runs)
        w.reserved_blocks -= self.out_blocks(req)
        w.outstanding -= 1
        self.num_done += 1
        self.system.on_complete(req)
        # The chain's next request follows this reply plus the recorded think time.
        wl = self.wl
        c = req.chain
        if c >= 0:
            nxt = req.turn + 1
            if nxt < wl.chain_ptr[c + 1] - wl.chain_ptr[c]:
                j = int(wl.chain_req[wl.chain_ptr[c] + nxt])
                self.loop.after(float(self.think_s[j]), self._arrive_chain, j)
        self._retry_admissions(w)
        self.kick(w)

    # ---- run ---------------------------------------------------------------------
    def run(self) -> Recorder:
        self._schedule_arrivals()
        if progress.is_shown():
            # Run in slices of simulated time so a bar can count finished requests.
            bar = progress.task(f"replay {self.system.name}", self.wl.num_requests, "req")
            until, counted = 0.0, 0
            while self.loop.pending():
                until += _PROGRESS_SLICE_S
                self.loop.run(until)
                bar.update(self.num_done - counted)
                counted = self.num_done
            bar.close()
        else:
            self.loop.run()
        if self.num_done != self.wl.num_requests:
            raise RuntimeError(
                f"replay stalled: {self.num_done} of {self.wl.num_requests} requests done "
                f"({self.num_arrived} arrived); is the GPU pool smaller than one request?")
        return self.finish(self.workers)

    def finish(self, workers: list[Worker]) -> Recorder:
        """Fill the recorder's per-worker figures from ``workers`` (this node's, or every
        node's of a cluster) once the loop has run."""
        rec = self.rec
        rec.num_events = self.loop.num_events
        rec.link_busy_s = [w.link.busy_s for w in workers]
        now = self.now
        for w in workers:
            w.queue.close(now)
        rec.queues = [w.queue for w in workers]
        rec.gpu_busy_s = [w.gpu_busy.busy_s for w in workers]
        rec.ssd_busy_s = [w.ssd.busy_s for w in workers]
        rec.offered_req_s = self.offered_req_s
        rec.offer_unreachable = self.offer_unreachable
        return rec
