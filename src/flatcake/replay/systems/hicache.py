"""``tiered`` and its variants: the tiered store read back through SGLang HiCache's L3
prefetch (mechanics and sources in ``prefetch.py``; the store in ``tiered.py``).

Per request with an SSD part (after the GPU prefix, the host-memory run is loaded at
prefill start; only the SSD-only blocks are prefetched)::

    arrive ─ rate-limited? ─ yes ─────────────────────────────► no prefetch, recompute
             └ no: reserve min(need, pool room) (truncate) ─► engine's prefetch thread
    best_effort: ready at once      ─┐
    wait_complete: ready when done  ─┼─► scheduled (prefill start): terminate, use the
    timeout: done or limit passed   ─┘   finished batches, release the reservation

Counters (``extra_metrics``): prefetches issued, rate-limited, truncated (and blocks
lost), terminated before complete (and blocks lost), bytes of terminated batches read
and thrown away, duplicate blocks read (already in host memory when their batch ended).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flatcake.replay.node.node import Node, Request, Worker, not_attached
from flatcake.replay.systems.prefetch import PrefetchOp, PrefetchThread, timeout_s
from flatcake.replay.systems.state import TState
from flatcake.replay.systems.tiered import TieredConfig, TieredSystem
from flatcake.replay.workload.runs import Runs, runs_len, slice_runs


class HiCacheSystem(TieredSystem):
    """``tiered`` (``best_effort``), ``tiered-wait``, ``tiered-timeout``, ``tiered-uring``."""

    def __init__(self, cfg: TieredConfig, name: str = "tiered") -> None:
        super().__init__(dataclasses.replace(cfg, direct=False), name)
        self.threads: list[PrefetchThread] = []
        self.reserved: list[int] = []  # host-pool blocks held by prefetches, per engine
        self.pool_blocks = 0
        self.limit_blocks = 0
        self.counts = {"issued": 0, "rate_limited": 0, "truncated": 0,
                       "truncated_blocks": 0, "terminated": 0, "terminated_blocks": 0,
                       "terminated_batch_bytes": 0, "duplicate_blocks": 0}

    def attach(self, node: Node) -> None:
        super().attach(node)
        # HiCache's host pool is per engine: the node's host budget shared evenly.
        self.pool_blocks = node.spec.host_memory_bytes // node.spec.num_workers // (
            self.peer.block_bytes)
        self.limit_blocks = int(self.cfg.prefetch_capacity_fraction * self.pool_blocks)
        self.reserved = [0] * len(node.workers)
        # Mooncake stages each batch in its client buffer: a batch never exceeds it.
        batch = max(1, min(self.cfg.batch_pages,
                           node.spec.staging_bytes_per_worker // self.obj_bytes))
        self.threads = [PrefetchThread(node.loop, batch, self._read_batch, self._batch_end,
                                       self._finished)
                        for _ in node.workers]

    # ---- issue ------------------------------------------------------------------------
    def on_arrival(self, req: Request) -> None:
        node = self.node
        if node is None or self.host is None:
            raise not_attached(self.name)
        w = node.workers[req.worker]
        g = w.gpu.prefix_hits(req.runs)
        _total, host_parts, ssd_parts = self.plan_read(req.runs, g, record=True)
        need = runs_len(ssd_parts)
        if need == 0:
            self._ready(req)
            return
        k = req.worker
        if self.reserved[k] >= self.limit_blocks:
            self.counts["rate_limited"] += 1
            node.rec.prefetch_cancellations += 1
            self._ready(req)
            return
        take = min(need, self.pool_blocks - self.reserved[k])
        if take < need:
            self.counts["truncated"] += 1
            self.counts["truncated_blocks"] += need - take
            node.rec.prefetch_cancellations += 1
        if take <= 0:
            self._ready(req)
            return
        self.reserved[k] += take
        st = TState()
        req.sys = st
        if host_parts:
            st.host_pinned = host_parts
            self.host.lru.pin(host_parts)
        st.op = PrefetchOp(req, slice_runs(ssd_parts, 0, take), take)
        self.counts["issued"] += 1
        req.restore_start_s = node.now
        self.threads[k].submit(st.op)
        policy = self.cfg.prefetch_policy
        if policy == "best_effort":
            self._mark_ready(req)
        elif policy == "timeout":
            limit = timeout_s(take * node.geometry.tokens_per_block, self.cfg.timeout_base_s,
                              self.cfg.timeout_per_ki_token_s, self.cfg.timeout_max_s)
            node.loop.after(limit, self._mark_ready, req)

    def _mark_ready(self, req: Request) -> None:
        st: TState = req.sys
        if not st.ready:
            st.ready = True
            self._ready(req)

    # ---- the engine's prefetch thread ---------------------------------------------------
    def _read_batch(self, op: PrefetchOp, parts: Runs) -> float:
        node = self.node
        if node is None:
            raise not_attached(self.name)
        spec = node.spec
        n = runs_len(parts)
        # SGLang's rule: the window pages at the prefetch's end come with its batch.
        wn = self._batch_windows(op, op.done_blocks, n)
        nbytes = n * self.obj_bytes + wn * self.win_obj_bytes
        cmds = (n + wn) * self.gpw
        qd = self.cfg.read_queue_depth or spec.ssd.queue_depth
        t = (self.cfg.batch_overhead_s + nbytes / spec.ssd.read_bytes_per_s
             + cmds * spec.ssd.command_latency_s / qd)
        w = node.workers[op.req.worker]
        node.rec.ssd_read(cmds, nbytes, t)
        end = w.ssd.submit(node.now, t, nbytes, cmds)
        # A prefetch starts with its storage hit query (``batch_exists``): the fixed
        # per-restore cost every system pays.
        return end + (spec.restore_overhead_s if op.done_blocks == 0 else 0.0)

    def _batch_windows(self, op: PrefetchOp, start: int, n: int) -> int:
        """Of the batch at prefetch positions ``[start, start + n)``, the blocks of the
        window at the prefetch's end whose window pages the store holds (SGLang's
        ``_sync_trailing_keys``: the last pages of the hit)."""
        w = self.wins.window_blocks
        if not w:
            return 0
        lo = max(start, op.total_blocks - w)
        return self.wins.count_runs(slice_runs(op.parts, lo, start + n))

    def _batch_end(self, op: PrefetchOp, parts: Runs, used: bool) -> None:
        if self.host is None:
            raise not_attached(self.name)
        n = runs_len(parts)
        if not used:
            self.counts["terminated_batch_bytes"] += n * self.obj_bytes + \
                self._batch_windows(op, op.done_blocks, n) * self.win_obj_bytes
            return
        node = self.node
        if node is not None:
            node.rec.ssd_useful_bytes += \
                self._batch_windows(op, op.done_blocks - n, n) * self.peer.window_bytes
        # Blocks another prefetch already brought into host memory were read twice.
        self.counts["duplicate_blocks"] += self.host.lru.count_present(parts)

    def _finished(self, op: PrefetchOp) -> None:
        node = self.node
        if node is None:
            raise not_attached(self.name)
        req = op.req
        if op.complete:
            node.rec.prefetch_s.append(node.now - req.arrival_s)
            req.restore_end_s = node.now
        if self.cfg.prefetch_policy != "best_effort":
            self._mark_ready(req)

    # ---- scheduled ----------------------------------------------------------------------
    def prefill_load(self, req: Request, worker: Worker) -> tuple[int, float]:
        st = req.sys
        op = st.op if isinstance(st, TState) else None
        if op is not None:
            self._terminate(req, st, op)
        return super().prefill_load(req, worker)

    def _terminate(self, req: Request, st: TState, op: PrefetchOp) -> None:
        """The request is scheduled: stop its prefetch, keep the finished batches."""
        node = self.node
        if node is None or self.host is None:
            raise not_attached(self.name)
        st.op = None
        if not op.complete:
            if op.done_blocks:
                node.rec.prefetch_s.append(node.now - req.arrival_s)
            op.terminated = True
            lost = op.total_blocks - op.done_blocks
            self.counts["terminated"] += 1
            self.counts["terminated_blocks"] += lost
            node.rec.prefetch_cancellations += 1
        if op.done_blocks:
            # HiCache inserts the fetched pages into its host radix tree.
            self._host_put(slice_runs(op.parts, 0, op.done_blocks))
            node.rec.ssd_useful_bytes += op.done_blocks * node.block_bytes
        self.reserved[req.worker] -= op.reserved_blocks
        if st.host_pinned is not None:
            self.host.lru.unpin(st.host_pinned)
            st.host_pinned = None

    def extra_metrics(self) -> dict[str, Any]:
        return {**super().extra_metrics(), **{f"prefetch_{k}": v
                                              for k, v in self.counts.items()}}
