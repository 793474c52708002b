"""The simulated node's parts: a request, a worker and the arrival queue;
``replay.node.node`` puts them together with a ``System``."""

from __future__ import annotations

import heapq
import math
from typing import Any

from flatcake.replay.node.blockcache import BlockLru
from flatcake.replay.node.devices import FifoServer
from flatcake.replay.node.occupancy import BusyTracker, LevelTracker
from flatcake.replay.workload.runs import Runs, runs_len
from flatcake.replay.workload.trace import Workload


class Request:
    """One request's state during a run (one object per request, never per block)."""

    __slots__ = (
        "admitted",
        "arrival_s",
        "chain",
        "decode_stall_s",
        "done_s",
        "first_token_s",
        "full_blocks",
        "gpu_prefix",
        "hit_blocks",
        "idx",
        "input_tokens",
        "load_layers",
        "load_s",
        "num_blocks",
        "output_tokens",
        "prefill_start_s",
        "ready_s",
        "restore_blocks",
        "restore_end_s",
        "restore_start_s",
        "runs",
        "session",
        "sys",
        "turn",
        "worker",
    )

    def __init__(self, idx: int, runs: Runs, arrival_s: float, wl: Workload) -> None:
        self.idx = idx
        self.runs = runs  # the request's blocks, in prefix order
        self.num_blocks = runs_len(runs)
        self.arrival_s = arrival_s
        self.chain = int(wl.chain[idx])
        self.session = int(wl.session[idx])
        self.turn = int(wl.turn[idx])
        self.input_tokens = int(wl.input_tokens[idx])
        # The prompt's full blocks: a trace that hashes its partial last block (the
        # Mooncake traces hash ceil(input / block)) lists one more; no engine caches it.
        self.full_blocks = min(self.num_blocks, self.input_tokens // wl.block_tokens)
        self.output_tokens = int(wl.output_tokens[idx])
        self.worker = -1
        self.admitted = False
        self.gpu_prefix = 0  # prefix-cache hit at admission (blocks)
        self.restore_blocks = 0  # blocks restored/loaded right after gpu_prefix
        self.hit_blocks = 0
        self.load_s = 0.0
        self.load_layers = 0  # > 0: load_s delivers this many layers in the step
        self.ready_s = math.nan
        self.prefill_start_s = math.nan
        self.first_token_s = math.nan
        self.done_s = math.nan
        self.restore_start_s = math.nan
        self.restore_end_s = math.nan
        self.decode_stall_s = 0.0  # the worker's prefill stall when last accounted
        self.sys: Any = None  # the system's per-request state


class Worker:
    """One GPU: KV pool with prefix cache, prefill server, decode batch, links."""

    __slots__ = ("busy", "decode_kv_bytes", "decoding", "gpu", "gpu_busy", "held", "idx",
                 "link", "num_sessions", "outstanding", "queue", "reserved_blocks", "ssd",
                 "stall_s", "waiting_admit")

    def __init__(self, idx: int, num_ids: int, capacity_blocks: int) -> None:
        self.idx = idx
        self.gpu = BlockLru(num_ids, capacity_blocks, name=f"gpu{idx}")
        self.reserved_blocks = 0  # output blocks of admitted requests
        self.busy = False  # prefill server
        # Ready requests popped from the system's queue that did not fit the GPU pool
        # yet, in queue order; they are offered again first.
        self.held: list[Request] = []
        self.waiting_admit: list[tuple[Request, Any]] = []  # restores waiting for memory
        self.decoding = 0
        self.decode_kv_bytes = 0.0
        self.link = FifoServer()  # host -> GPU
        self.ssd = FifoServer()  # this worker's SSD channel
        self.num_sessions = 0
        self.outstanding = 0
        self.queue = LevelTracker()  # requests arrived here that have not started prefill
        self.gpu_busy = BusyTracker()  # prefilling or decoding
        self.stall_s = 0.0  # total prefill time that held the decode batch back


class ArrivalQueue:
    """Ready requests of one worker in arrival order (ties: submission order)."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Request]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, req: Request) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (req.arrival_s, self._seq, req))

    def pop(self) -> Request | None:
        return heapq.heappop(self._heap)[2] if self._heap else None
