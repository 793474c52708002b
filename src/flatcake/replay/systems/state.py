"""Per-request state of the FlatCake and tiered systems, the host tier the tiered
systems share, and what each asks of the part that reads other nodes' blocks in a
cluster that shares KV (``systems.sharing``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from flatcake.control.index import PrefixHit
from flatcake.control.signals import TurnInfo
from flatcake.readplan import ReadPlan
from flatcake.replay.node.blockcache import BlockLru
from flatcake.replay.workload.runs import EMPTY_RUNS, Runs

if TYPE_CHECKING:
    import numpy as np

    from flatcake.replay.node.parts import Request


class FcState:
    __slots__ = ("gpu_prefix", "hit", "in_step", "keys", "load_pinned", "needs_ssd", "plan",
                 "refill_bytes", "refills", "turn")

    def __init__(self, hit: PrefixHit, keys: tuple[bytes, ...], turn: TurnInfo) -> None:
        self.hit = hit
        self.keys = keys
        self.turn = turn
        self.needs_ssd = False
        self.in_step = False  # the SSD part loads with the prefill (ssd_loads_in_step)
        self.load_pinned = False
        self.gpu_prefix = 0  # GPU prefix when the load was planned
        self.plan: ReadPlan | None = None
        self.refills: tuple[int, ...] = ()  # homes whose memory copies the restore fills
        self.refill_bytes = 0  # their bytes


class FcSharing(Protocol):
    """What a FlatCake node of a cluster that shares KV asks of the part that reads
    other nodes' blocks (``systems.sharing``)."""

    def arrive(self, req: Request, keys: tuple[bytes, ...], hit: PrefixHit, g: int) -> bool:
        """Serve the blocks past the local ``hit`` from other nodes; True when it took
        the request over."""
        ...

    def start(self, req: Request) -> bool:
        """Start the restore of a request it took over (True), else leave it (False)."""
        ...

    def release(self, req: Request) -> bool:
        """Unpin what a restore it took over read (True), else leave it (False)."""
        ...

    def metrics(self) -> dict[str, Any]: ...


class HostTier:
    """The host-memory LRU tier shared by the node's workers."""

    def __init__(self, num_ids: int, capacity_blocks: int) -> None:
        self.lru = BlockLru(num_ids, capacity_blocks, name="host")

    def prefix(self, runs: Runs, start: int) -> int:
        return self.lru.prefix_hits(runs, start)


class TState:
    __slots__ = ("host_pinned", "op", "ready", "ssd_parts")

    def __init__(self) -> None:
        self.host_pinned: Runs | None = None
        self.ssd_parts: Runs = EMPTY_RUNS
        self.op: Any = None  # the request's L3 prefetch (staged systems)
        self.ready = False


class TieredSharing(Protocol):
    """What a tiered node of a cluster that shares KV asks of the part that reads other
    nodes' blocks (``systems.sharing``)."""

    def arrive(self, req: Request, end: int) -> bool:
        """Restore blocks from ``end`` on from other nodes; True when it took the
        request over."""
        ...

    def start(self, req: Request) -> bool:
        """Start the reads of a request it took over (True), else leave it (False)."""
        ...

    def to_put(self, s: int, e: int) -> np.ndarray | None:
        """Which of blocks ``[s, e)`` a finished turn puts, the cluster's holdings
        counted; ``None``: this node's own rule."""
        ...

    def metrics(self) -> dict[str, Any]: ...
