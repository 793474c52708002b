"""Tiered baselines: ``tiered`` (SGLang HiCache over Mooncake Store) and ``tiered-direct``
(Mooncake with GDS reads).

What the model does, and where each behaviour comes from:

* **New blocks enter host memory.** A finished turn's blocks that the store does not
  hold yet are put into the host tier (HiCache's write-through backup of computed
  pages; Mooncake Store ``Put`` into its memory segment; keys that exist are skipped).
* **LRU demotes to SSD, in eviction order.** When host memory is full, the least
  recently used blocks leave it; a block without an SSD copy is written to SSD, in the
  order it was evicted, into the open *bucket*. Mooncake's ``BucketStorageBackend``
  groups offloaded objects into bucket files and seals a bucket at
  ``bucket_size_limit`` = 256 MB or ``bucket_keys_limit`` = 500 keys (defaults in
  ``mooncake-store/include/storage_backend.h`` / ``bucket_backend_config``).
* **Buckets are recycled FIFO** (``buckets.py``). When the SSD budget is full, the
  oldest bucket is deleted whole (``PrepareEviction`` picks the oldest bucket; policy
  FIFO), so its blocks, which belong to many sessions, all disappear at once.
* **SSD hits come back through HiCache's L3 prefetch** (``tiered``; the mechanics, with
  their sources, are in ``replay/systems/prefetch.py``): issued at arrival into the
  engine's host pool under a budget of half that pool, truncated to the pool's room, one
  prefetch thread per engine reading 128-page batches, Mooncake's sequential ``pread``
  per object (queue depth 1; ``tiered-uring`` keeps the drive's queue depth), and a
  termination policy: ``best_effort`` (SGLang's default: the request runs as soon as it
  can and uses the batches finished by then), ``wait_complete`` (``tiered-wait``) or
  ``timeout`` (``tiered-timeout``). Prefetched pages join the host tier (HiCache inserts
  them into its host radix tree) and are copied to the GPU when the prefill starts.
  Prefetches shorter than ``prefetch_threshold`` = 256 tokens are not issued.
* **Host-memory hits** (the run of blocks in the host tier right after the GPU prefix)
  are copied host->GPU when the prefill starts (``load_back``, overlapped with compute).
  The host tier is the node's whole host budget, shared by the engines: a
  simplification in the baseline's favour (Mooncake's DRAM replicas on another engine's
  node would also need the L3 prefetch).
* **tiered-direct** keeps the placement, eviction order and buckets but reads SSD hits
  straight into the GPU (GDS), with no host pool and so no termination. Paged KV in the
  GPU is one tensor per layer, so each (block, layer) lands in a different place: one
  read command per block per layer (``direct_reads_per_layer``), each of its layer's
  block size at an eviction-order offset; a windowed layer only for the window blocks
  at the hit's end, if the engine prefix-caches it (``layers.PeerBlocks``: vLLM's rules).
* Sliding windows the engine prefix-caches follow the rule of the engine each
  baseline models (``layers.PeerBlocks``, ``TieredConfig.window_rule``):
  ``tiered-direct`` vLLM's (every block's object and host slot hold its windowed
  layers), the HiCache baselines SGLang's (one trailing window per finished request,
  written, demoted and recycled with its block; a hit whose trailing window is not held
  is cut back to the longest prefix that has one: ``windows.TrailingWindows``). A
  host->GPU copy or a load moves the window blocks at the hit's end only.
* On a tensor-parallel worker (``gpus_per_worker`` > 1) every GPU stores and reads its
  own share of each object, so commands multiply by the GPU count and shrink by it.

Requests restoring are set aside and rejoin the ready queue at their arrival position
(vLLM ``WAITING_FOR_REMOTE_KVS``; SGLang skips a request whose prefetch may not end yet);
restores do not block other requests.

Sources read: kvcache-ai/Mooncake ``mooncake-store/include/storage_backend.h``
(``BucketStorageBackend``, bucket eviction), ``mooncake-store/src/storage_backend.cpp``
(``BatchLoad``), ``mooncake-store/src/file_storage.cpp`` (``AllocateBatch``);
sgl-project/sglang ``python/sglang/srt/mem_cache/hiradix_cache.py`` and
``managers/cache_controller.py`` (see ``prefetch.py``); LMCache local-disk backend
(one file per 256-token chunk, LRU) as another per-chunk layout. The constants, with
their sources, are ``TieredConfig`` (``tiered_config``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from flatcake.replay.node.node import ArrivalQueue, Node, Request, System, Worker, not_attached
from flatcake.replay.systems.buckets import SsdBuckets
from flatcake.replay.systems.layers import LayerBooks, PeerBlocks, direct_reads
from flatcake.replay.systems.settings import TieredConfig
from flatcake.replay.systems.state import HostTier, TieredSharing, TState
from flatcake.replay.systems.windows import TrailingWindows
from flatcake.replay.workload.runs import EMPTY_RUNS, Runs, runs_len, runs_of, slice_runs


class TieredSystem(System):
    """The tiered store (host tier, eviction-order buckets) with ``tiered-direct``'s
    read path; ``HiCacheSystem`` (``hicache.py``) replaces the read path with SGLang's
    L3 prefetch. ``sharing``: in a cluster that shares KV, builds the part that reads
    the blocks other nodes hold (given this system)."""

    def __init__(self, cfg: TieredConfig, name: str | None = None,
                 sharing: Callable[[TieredSystem], TieredSharing] | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.name = name or "tiered-direct"
        self.sharing = sharing(self) if sharing is not None else None
        self.queues: list[ArrivalQueue] = []
        self.host: HostTier | None = None
        self.ssd = SsdBuckets(cfg, 0, 0)
        self.bucket_of = self.ssd.bucket_of  # per block id: its bucket, -1 if not on SSD
        self.obj_bytes = 0
        self.gpw = 1
        self.direct = np.zeros((2, 0), dtype=np.int64)
        self.direct_cmds = self.direct_bytes = 0
        self.peer = PeerBlocks(0, 0, 0, np.zeros((2, 0), dtype=np.int64))
        self.window_cmds = self.window_bytes = 0
        self.wins = TrailingWindows(0, 0)  # SGLang's rule: which blocks hold windows
        self.win_obj_bytes = 0  # an SSD object of one block's window pages
        self.prefill_cut_blocks = 0
        self.books: LayerBooks | None = None

    def attach(self, node: Node) -> None:
        super().attach(node)
        n = node.wl.num_ids
        self.queues = [ArrivalQueue() for _ in node.workers]
        self.peer = peer = PeerBlocks.of(node.geometry, node.spec, self.cfg.window_rule)
        self.wins = TrailingWindows(n, 0 if peer.every_block else peer.window_blocks)
        self.host = HostTier(n, node.spec.host_memory_bytes // peer.block_bytes)
        gpw = node.spec.gpus_per_worker
        self.gpw = gpw
        # One object per block per GPU of the worker (its share of the KV heads).
        self.obj_bytes = gpw * node.spec.ssd.aligned(-(-peer.block_bytes // gpw))
        self.win_obj_bytes = gpw * node.spec.ssd.aligned(-(-peer.window_bytes // gpw))
        self.ssd = SsdBuckets(self.cfg, n, self.obj_bytes, self.win_obj_bytes, self.wins,
                              self.host.lru.tick)
        self.bucket_of = self.ssd.bucket_of
        # tiered-direct: one command per (block, layer) per GPU, each of its layer's size.
        self.direct = direct_reads(node.geometry, node.spec)
        self.direct_cmds, self.direct_bytes = (int(v) for v in self.direct.sum(axis=1))
        self.window_cmds, self.window_bytes = (int(v) for v in peer.window_direct.sum(axis=1))
        self.books = LayerBooks(node.geometry)

    # ---- host tier and SSD buckets --------------------------------------------------
    def _host_put(self, runs: Runs) -> None:
        """Put/refresh ``runs`` in the host tier, then demote what overflows."""
        if self.host is None:
            raise not_attached(self.name)
        lru = self.host.lru
        lru.touch(runs)
        node = self.node
        if node is None:
            raise not_attached(self.name)
        while (over := self._host_over(node)) > 0:
            evicted = lru.evict(over)
            if not len(evicted):
                break
            self.ssd.demote(node, evicted)
            # What found no room on SSD is gone, its window pages with it.
            self.wins.drop(evicted[self.bucket_of[evicted] < 0])

    def _host_over(self, node: Node) -> int:
        """Blocks the host tier must demote: those past its capacity, and room for the
        window pages its blocks hold under SGLang's rule (they share the host budget:
        SGLang keeps them in a host pool of their own, out of the same memory)."""
        if self.host is None:
            raise not_attached(self.name)
        lru = self.host.lru
        over = lru.size - lru.capacity_blocks
        if not self.wins.num_held:
            return over
        per, win = self.peer.block_bytes, self.peer.window_bytes
        used = lru.size * per + self.wins.held_in(lru.tick != 0) * win
        over_bytes = used - node.spec.host_memory_bytes
        return -(-over_bytes // (per + win)) if over_bytes > 0 else 0

    def _lookup(self, runs: Runs, start: int) -> tuple[int, Runs, Runs]:
        """From position ``start``, the run of blocks the store holds (host memory or
        SSD, like a key-existence check over both tiers): its length, its host-resident
        pieces and its SSD-only pieces."""
        if self.host is None:
            raise not_attached(self.name)
        tick = self.host.lru.tick
        bucket_of = self.bucket_of
        total = 0
        host_parts: list[tuple[int, int]] = []
        ssd_parts: list[tuple[int, int]] = []
        for s, e in slice_runs(runs, start, 1 << 62):
            in_host = tick[s:e] != 0
            held = in_host | (bucket_of[s:e] >= 0)
            stop = not held.all()
            n = int(np.argmin(held)) if stop else e - s
            if n:
                h = in_host[:n]
                if h.all():
                    host_parts.append((s, s + n))
                elif not h.any():
                    ssd_parts.append((s, s + n))
                else:
                    host_parts.extend(runs_of(np.flatnonzero(h).astype(np.int32) + s))
                    ssd_parts.extend(runs_of(np.flatnonzero(~h).astype(np.int32) + s))
            total += n
            if stop:
                break
        return total, tuple(host_parts), tuple(ssd_parts)

    def plan_read(self, runs: Runs, g: int, record: bool = False) -> tuple[int, Runs, Runs]:
        """What to restore after a GPU prefix of ``g``: SSD prefetches shorter than the
        threshold are not issued, so the hit then stops at the host-memory prefix.
        ``record``: count a window cut-back (``TrailingWindows.cut``)."""
        if self.node is None or self.host is None:
            raise not_attached(self.name)
        total, host_parts, ssd_parts = self._lookup(runs, g)
        end = self.wins.cut(runs, g, g + total, record)
        if end < g + total:  # SGLang's rule: back to a prefix whose window is held
            total, host_parts, ssd_parts = self._lookup(slice_runs(runs, 0, end), g)
        n_ssd = runs_len(ssd_parts)
        bt = self.node.geometry.tokens_per_block
        if n_ssd and n_ssd * bt < self.cfg.prefetch_threshold_tokens:
            hm = self.host_prefix(runs, g)
            return hm, slice_runs(runs, g, g + hm), EMPTY_RUNS
        return total, host_parts, ssd_parts

    def host_prefix(self, runs: Runs, g: int, record: bool = False) -> int:
        """The run of blocks in host memory right after a GPU prefix of ``g``, cut back
        to a prefix whose trailing window is held (SGLang's rule); ``record``: count
        the blocks cut (``prefill_window_cut_blocks``: a prefetch ended inside a turn)."""
        if self.host is None:
            raise not_attached(self.name)
        hm = self.host.prefix(runs, g)
        got = self.wins.cut(runs, g, g + hm) - g
        if record:
            self.prefill_cut_blocks += hm - got
        return got

    # ---- arrival / restore (GDS straight into the GPU) ---------------------------
    def on_arrival(self, req: Request) -> None:
        node = self.node
        if node is None or self.host is None:
            raise not_attached(self.name)
        w = node.workers[req.worker]
        runs = req.runs
        g = w.gpu.prefix_hits(runs)
        total, host_parts, ssd_parts = self.plan_read(runs, g, record=True)
        if (g + total < req.num_blocks and self.sharing is not None
                and self.sharing.arrive(req, g + total)):
            return
        if runs_len(ssd_parts) == 0:
            self._ready(req)  # host-memory hits are loaded when the prefill starts
            return
        st = TState()
        req.sys = st
        if host_parts:
            st.host_pinned = host_parts
            self.host.lru.pin(host_parts)
        req.restore_start_s = node.now
        node.admit_or_wait(req, self.start_io)

    def start_io(self, req: Request) -> None:
        node = self.node
        if node is None or self.host is None:
            raise not_attached(self.name)
        if self.sharing is not None and self.sharing.start(req):
            return
        st: TState = req.sys
        w = node.workers[req.worker]
        g = req.gpu_prefix
        total, _host_parts, ssd_parts = self.plan_read(req.runs, g)
        s = runs_len(ssd_parts)
        hm = total - s
        st.ssd_parts = ssd_parts
        req.restore_blocks = total
        window = self.window_tail(req.runs, g, g + total)
        end = self.read_local(w, hm, s, window)
        if s == 0:
            node.loop.at(end, self.restore_done, (req, 0, 0))
            return
        node.loop.at(end + node.spec.restore_overhead_s, self.restore_done,
                     (req, s, s * node.block_bytes + window[1] * self.peer.window_bytes))

    def window_tail(self, runs: Runs, start: int, end: int) -> tuple[int, int]:
        """Of the window blocks at the end of a hit on blocks ``[start, end)`` of
        ``runs`` (its last ``PeerBlocks.window_blocks``), how many are in host memory
        and how many on SSD only."""
        if self.host is None:
            raise not_attached(self.name)
        w = self.peer.window_blocks
        if not w or end <= start:
            return 0, 0
        tick = self.host.lru.tick
        in_host = sum(int(np.count_nonzero(tick[s:e])) for s, e in
                      slice_runs(runs, max(start, end - w), end))
        return in_host, min(w, end - start) - in_host

    def read_local(self, w: Worker, host_blocks: int, ssd_blocks: int,
                   window: tuple[int, int] = (0, 0)) -> float:
        """Copy ``host_blocks`` over ``w``'s host->GPU link and read ``ssd_blocks``
        straight into the GPU on its SSD channel; ``window``: how many of the window
        blocks at the hit's end are among each (``window_tail``), whose windowed layers
        come too. Returns when both are done."""
        node = self.node
        if node is None:
            raise not_attached(self.name)
        now = node.now
        spec = node.spec
        hm, s = host_blocks, ssd_blocks
        host_end = now
        if hm:
            hb = hm * node.block_bytes + window[0] * self.peer.window_bytes
            host_end = w.link.submit(now, hb / spec.host_to_gpu_bytes_per_s, hb)
        if s == 0:
            return host_end
        gpw = self.gpw
        if self.cfg.direct_reads_per_layer:
            ws = window[1]
            cmds = s * self.direct_cmds + ws * self.window_cmds
            nbytes = s * self.direct_bytes + ws * self.window_bytes
            if self.books is not None:
                self.books.read(s * self.direct[0] + ws * self.peer.window_direct[0])
        else:
            cmds = s * gpw
            nbytes = s * self.obj_bytes
        t = spec.ssd.read_time_s(cmds, nbytes)
        end = w.ssd.submit(now, t, nbytes, cmds)
        node.rec.ssd_read(cmds, nbytes, t)
        return max(end, host_end)

    def restore_done(self, arg: tuple[Request, int, int]) -> None:
        req, s, useful = arg
        node = self.node
        if node is None or self.host is None:
            raise not_attached(self.name)
        st: TState = req.sys
        req.restore_end_s = node.now
        if s:
            node.rec.prefetch_s.append(node.now - req.arrival_s)
            node.rec.ssd_useful_bytes += useful
        if st.host_pinned is not None:
            self.host.lru.unpin(st.host_pinned)
            st.host_pinned = None
        st.ssd_parts = EMPTY_RUNS
        self._ready(req)

    # ---- prefill / store --------------------------------------------------------------
    def _ready(self, req: Request) -> None:
        if self.node is None:
            raise not_attached(self.name)
        self.queues[req.worker].push(req)
        self.node.make_ready(req)

    def pop_ready(self, worker: Worker) -> Request | None:
        return self.queues[worker.idx].pop()

    def prefill_load(self, req: Request, worker: Worker) -> tuple[int, float]:
        node = self.node
        if node is None or self.host is None:
            raise not_attached(self.name)
        g = req.gpu_prefix
        hm = self.host_prefix(req.runs, g, record=True)
        if not hm:
            return 0, 0.0
        self.host.lru.touch(slice_runs(req.runs, g, g + hm))
        nbytes = hm * node.block_bytes + min(self.peer.window_blocks, hm) * self.peer.window_bytes
        now = node.now
        end = worker.link.submit(now, nbytes / node.spec.host_to_gpu_bytes_per_s, nbytes)
        return hm, end - now

    def on_complete(self, req: Request) -> None:
        if self.host is None:
            raise not_attached(self.name)
        # SGLang's rule: the turn's trailing window pages are backed up with its blocks.
        self.wins.mark(req.runs, req.full_blocks)
        # Put the full blocks the store does not hold (and refresh those in memory);
        # blocks that only have an SSD copy are not put again. A partial last block is
        # no page the engine's tree caches (nor a key any later request shares).
        put: list[tuple[int, int]] = []
        for s, e in slice_runs(req.runs, 0, req.full_blocks):
            keep = self._to_put(s, e)
            if keep.all():
                put.append((s, e))
            elif keep.any():
                put.extend(runs_of(np.flatnonzero(keep).astype(np.int32) + s))
        if put:
            self._host_put(tuple(put))

    def _to_put(self, s: int, e: int) -> np.ndarray:
        """Which of blocks ``[s, e)`` a finished turn puts: those in host memory (a
        refresh) and those the store does not hold."""
        if self.host is None:
            raise not_attached(self.name)
        if self.sharing is not None:
            keep = self.sharing.to_put(s, e)
            if keep is not None:
                return keep
        return (self.host.lru.tick[s:e] != 0) | (self.bucket_of[s:e] < 0)

    def extra_metrics(self) -> dict[str, Any]:
        return {
            **self.ssd.metrics(),
            **self.wins.metrics(),
            **({"prefill_window_cut_blocks": self.prefill_cut_blocks}
               if self.wins.window_blocks else {}),
            **({"restore_commands_by_kind": self.books.metrics()["restore_commands_by_kind"]}
               if self.books is not None and self.books.restores else {}),
            **(self.sharing.metrics() if self.sharing is not None else {}),
        }
