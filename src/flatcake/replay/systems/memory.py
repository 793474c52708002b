"""``memory-only``: GPU + host-memory LRU, no SSD (SGLang HiCache with L1 and L2 only).

* Every computed page is backed up to host memory when its request finishes
  (``--hicache-write-policy write_through``, the documented default in HiCache's best
  practices); the host pool is an LRU that drops what overflows (there is no L3).
* A request's GPU prefix-cache hit is extended by the run of blocks found in host
  memory right after it; those are copied host->GPU when its prefill starts
  (``load_back``, overlapped layer by layer with the compute).
* No prefetch, no SSD, nothing is ever cancelled.
* A sliding window the engine prefix-caches follows SGLang's rule
  (``windows.TrailingWindows``): each finished request backs up its trailing window's
  pages, a host hit is cut back to the longest prefix whose trailing window is held,
  and the window's blocks at the hit's end are copied with it.

Sources read: sgl-project/sglang ``docs/advanced_features/hicache_best_practices.md``
(tiers, ``--hicache-ratio``, write policies) and ``python/sglang/srt/mem_cache/
hiradix_cache.py`` (``match_prefix`` host hit length, ``load_back``, ``evict_host``).
"""

from __future__ import annotations

from typing import Any

from flatcake.replay.node.blockcache import BlockLru
from flatcake.replay.node.node import ArrivalQueue, Node, Request, System, Worker, not_attached
from flatcake.replay.systems.layers import PeerBlocks
from flatcake.replay.systems.windows import TrailingWindows
from flatcake.replay.workload.runs import slice_runs


class MemoryOnlySystem(System):
    """GPU prefix cache plus a node-wide host LRU of ``host_memory_bytes``."""

    name = "memory-only"

    def __init__(self) -> None:
        super().__init__()
        self.queues: list[ArrivalQueue] = []
        self.host: BlockLru | None = None
        self.blocks_dropped = 0
        self.peer: PeerBlocks | None = None
        self.wins = TrailingWindows(0, 0)

    def attach(self, node: Node) -> None:
        super().attach(node)
        self.queues = [ArrivalQueue() for _ in node.workers]
        # SGLang's window rule (``layers.PeerBlocks``): one trailing window per request.
        self.peer = PeerBlocks.of(node.geometry, node.spec, "sglang")
        self.wins = TrailingWindows(node.wl.num_ids, self.peer.window_blocks)
        self.host = BlockLru(node.wl.num_ids,
                             node.spec.host_memory_bytes // self.peer.block_bytes, name="host")

    def on_arrival(self, req: Request) -> None:
        if self.node is None:
            raise not_attached(self.name)
        self.queues[req.worker].push(req)
        self.node.make_ready(req)

    def pop_ready(self, worker: Worker) -> Request | None:
        return self.queues[worker.idx].pop()

    def prefill_load(self, req: Request, worker: Worker) -> tuple[int, float]:
        node, host, peer = self.node, self.host, self.peer
        if node is None or host is None or peer is None:
            raise not_attached(self.name)
        g = req.gpu_prefix
        hm = self.wins.cut(req.runs, g, g + host.prefix_hits(req.runs, g), record=True) - g
        if not hm:
            return 0, 0.0
        host.touch(slice_runs(req.runs, g, g + hm))
        nbytes = hm * node.block_bytes + min(peer.window_blocks, hm) * peer.window_bytes
        now = node.now
        end = worker.link.submit(now, nbytes / node.spec.host_to_gpu_bytes_per_s, nbytes)
        return hm, end - now

    def on_complete(self, req: Request) -> None:
        host = self.host
        if host is None:
            raise not_attached(self.name)
        if not req.runs:
            return
        self.wins.mark(req.runs, req.full_blocks)
        host.touch(slice_runs(req.runs, 0, req.full_blocks))  # full blocks only
        # The window pages of the blocks that hold them share the host budget (SGLang
        # keeps them in a host pool of their own, out of the same memory).
        peer, node = self.peer, self.node
        if peer is None or node is None:
            raise not_attached(self.name)
        per, win = peer.block_bytes, peer.window_bytes
        while (over := host.size * per + self.wins.num_held * win
               - node.spec.host_memory_bytes) > 0:
            dropped = host.evict(max(1, -(-over // (per + win))))
            if not len(dropped):
                break
            self.wins.drop(dropped)
            self.blocks_dropped += len(dropped)

    def extra_metrics(self) -> dict[str, Any]:
        return {"host_blocks_dropped": self.blocks_dropped, **self.wins.metrics()}
