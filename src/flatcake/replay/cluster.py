"""The replay at cluster scale: ``nodes`` simulated serving nodes on one clock.

Each node is a whole ``replay.node.node.Node`` (its workers, host memory, SSDs) with its
own store: its own ``System`` object and so, for FlatCake, its own ``ControlPlane``
books, whose addresses carry the node's id in their node bits. The nodes run on one
event loop and fill one recorder, so a cluster run is summarised like a one-node run
(per-worker figures over every worker of every node).

**Routing** between nodes, per request (inside a node the preset's worker routing still
applies):

* ``session``: session-affine, a hash of the session id picks the node, so every turn
  of a session (sub-agents included) lands on the same node;
* ``round_robin``: each request goes to the next node in turn, so a session's next turn
  usually lands on a node that did not run its last one (a global-clock trace's
  requests without a session are spread this way under both routings).

**Sharing.** With ``sharing`` on, the nodes' stores form one cluster index: a block a
node holds (published after its bytes are durable, as ``flatcake.cluster`` publishes
to Redis) is found by the others. A request looks up its own node first, then, from
where the local hit stops, the other nodes block by block: the local node when it holds
the next block, else another node holding it, host memory before SSD, then the lowest
node id (``ClusterIndex.lookup``'s order). A remote block costs its owner's SSD read
when it lives on SSD (on the owner's least busy SSD channel) and a transfer on the
requesting worker's NIC (``NetSpec``: bandwidth, plus a fixed latency per transfer);
remote transfers of one worker queue on its NIC first come first served, and the
owner's read overlaps the transfer (the owner stages layer by layer). The owner's
blocks stay pinned until the restore ends. With ``sharing`` off every node sees only
its own store, so a session routed to a node that lacks its history recomputes it.
Systems that share: ``flatcake`` and ``flatcake-1q`` (the real books of every node) and
``tiered-direct`` (Mooncake Store's cluster-wide object lookup); see
``replay.systems.sharing``.

One node (``nodes=1``) never builds a cluster: ``run_cluster`` runs the one-node replay.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from flatcake.replay.node.clock import EventLoop
from flatcake.replay.node.devices import FifoServer, NetSpec
from flatcake.replay.node.metrics import Recorder, RunMetrics
from flatcake.replay.node.node import Node, Worker
from flatcake.replay.presets import ReplayPreset
from flatcake.replay.simulate import replay_blocks, run_replay, timed_run
from flatcake.replay.systems import SHARING_SYSTEMS, make_system
from flatcake.replay.workload.trace import Workload

logger = logging.getLogger(__name__)

NODE_ROUTINGS: tuple[str, ...] = ("session", "round_robin")

_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """How many nodes, how requests reach them, and whether they share KV.

    Attributes:
        nodes: serving nodes (each the preset's whole node).
        routing: ``session`` (session-affine) or ``round_robin`` (per request).
        sharing: nodes read each other's blocks through the cluster index.
    """

    nodes: int = 1
    routing: str = "session"
    sharing: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, int) or not 1 <= self.nodes <= 4096:
            raise ValueError(f"cluster nodes must be an int in [1, 4096] (the address's "
                             f"12 node bits), got {self.nodes!r}")
        if self.routing not in NODE_ROUTINGS:
            raise ValueError(f"cluster routing {self.routing!r}: choose one of "
                             f"{', '.join(NODE_ROUTINGS)}")

    def label(self) -> str:
        share = "shared" if self.sharing else "not shared"
        return f"{self.nodes} nodes, {self.routing} routing, KV {share}"


def session_node(session: int, nodes: int) -> int:
    """The node of a session under session-affine routing (a multiplicative hash)."""
    return (((session * _GOLDEN) & _MASK64) >> 32) % nodes


class Cluster:
    """``spec.nodes`` nodes replaying ``workload`` with ``system`` at ``rate_req_s``
    requests per second in all (the rate the one-node replay offers one node)."""

    def __init__(self, workload: Workload, system: str, preset: ReplayPreset,
                 rate_req_s: float, spec: ClusterSpec, seed: int = 0) -> None:
        if spec.sharing and spec.nodes > 1 and system not in SHARING_SYSTEMS:
            raise ValueError(f"system {system!r} cannot share KV across nodes; choose one "
                             f"of {', '.join(SHARING_SYSTEMS)} or turn sharing off")
        workload, geometry = replay_blocks(workload, preset)
        self.wl = workload
        self.spec = spec
        self.net: NetSpec = preset.net
        self.system_name = system
        self.loop = EventLoop()
        self.rec = Recorder(workload.num_requests, spec.nodes * preset.node.num_workers)
        self.nodes: list[Node] = []
        fc = preset.flatcake_config()
        shared_keys: Any = None
        for k in range(spec.nodes):
            cfg = dataclasses.replace(fc, store=dataclasses.replace(fc.store, node_id=k))
            sysobj = make_system(system, cfg, preset.tiered, shared=spec.sharing)
            if shared_keys is not None:
                sysobj.keys = shared_keys  # type: ignore[attr-defined]
            node = Node(workload, sysobj, preset.node, geometry, rate_req_s, seed,
                        think_cap_s=preset.think_cap_s, loop=self.loop, rec=self.rec)
            shared_keys = getattr(sysobj, "keys", None)
            node.cluster = self
            if self.nodes:
                node.seen = self.nodes[0].seen  # the infinite-cache bound is the cluster's
            self.nodes.append(node)
        for k, node in enumerate(self.nodes):
            sharing = getattr(node.system, "sharing", None)
            if sharing is not None:
                sharing.join(self, k)
        # Each worker's NIC (remote reads into that GPU queue on it).
        self.nics = [[FifoServer() for _ in node.workers] for node in self.nodes]
        self.requests_per_node = np.zeros(spec.nodes, dtype=np.int64)
        self._rr = -1
        self.remote_transfers = 0
        self.remote_blocks = 0
        self.remote_memory_bytes = 0
        self.remote_ssd_bytes = 0

    # ---- routing -------------------------------------------------------------------
    def route(self, i: int) -> Node:
        """The node request ``i`` arrives at."""
        n = self.spec.nodes
        s = int(self.wl.session[i])
        if self.spec.routing == "session" and s >= 0:
            k = session_node(s, n)
        else:
            self._rr = (self._rr + 1) % n
            k = self._rr
        self.requests_per_node[k] += 1
        return self.nodes[k]

    # ---- remote reads --------------------------------------------------------------
    def fetch(self, node: int, worker: int, owner: int, ssd_commands: int, ssd_bytes: int,
              memory_bytes: int, blocks: int, wire_bytes: int | None = None) -> float:
        """Read ``blocks`` of ``owner`` into ``worker`` of ``node``: ``ssd_bytes`` in
        ``ssd_commands`` from the owner's SSD plus ``memory_bytes`` from its host memory,
        ``wire_bytes`` of them over the worker's NIC (default: all; the owner's read
        padding stays on the owner). Returns when the bytes are in the GPU."""
        own = self.nodes[owner]
        now = self.loop.now
        end = now
        if ssd_bytes:
            w: Worker = min(own.workers, key=lambda x: x.ssd.busy_until_s)
            t = own.spec.ssd.read_time_s(ssd_commands, ssd_bytes)
            end = w.ssd.submit(now, t, ssd_bytes, ssd_commands)
            self.rec.ssd_read(ssd_commands, ssd_bytes, t)
        nbytes = ssd_bytes + memory_bytes if wire_bytes is None else wire_bytes
        net_end = self.nics[node][worker].submit(now, nbytes / self.net.bytes_per_s, nbytes, 1)
        self.remote_transfers += 1
        self.remote_blocks += blocks
        self.remote_memory_bytes += memory_bytes
        self.remote_ssd_bytes += ssd_bytes
        return max(end, net_end) + self.net.latency_s

    # ---- run -----------------------------------------------------------------------
    def run(self) -> Recorder:
        first = self.nodes[0]
        first._schedule_arrivals()  # every arrival goes through ``route``
        for node in self.nodes[1:]:
            node.think_s = first.think_s
        self.loop.run()
        done = sum(node.num_done for node in self.nodes)
        if done != self.wl.num_requests:
            raise RuntimeError(f"cluster replay stalled: {done} of {self.wl.num_requests} "
                               f"requests done")
        return first.finish([w for node in self.nodes for w in node.workers])

    def extra_metrics(self) -> dict[str, Any]:
        """The systems' counters summed over the nodes, plus the cluster's own."""
        out: dict[str, Any] = {}
        for node in self.nodes:
            for key, value in node.system.extra_metrics().items():
                out[key] = _add(out.get(key), value)
        span = max(self.loop.now, 1e-12)
        nics = [nic for per_node in self.nics for nic in per_node]
        out.update({
            "nodes": self.spec.nodes,
            "node_routing": self.spec.routing,
            "sharing": self.spec.sharing,
            "net_gbps_per_worker": self.net.bytes_per_s / 1e9,
            "net_latency_s": self.net.latency_s,
            "remote_transfers": self.remote_transfers,
            "remote_blocks": self.remote_blocks,
            "remote_memory_bytes": self.remote_memory_bytes,
            "remote_ssd_bytes": self.remote_ssd_bytes,
            "nic_busy_frac": sum(n.busy_s for n in nics) / len(nics) / span,
            "requests_per_node": [int(x) for x in self.requests_per_node],
        })
        return out


def _add(a: Any, b: Any) -> Any:
    if a is None:
        return dict(b) if isinstance(b, dict) else b
    if isinstance(b, dict):
        return {k: _add(a.get(k), v) for k, v in {**a, **b}.items()}
    if isinstance(b, int | float) and not isinstance(b, bool):
        return a + b
    return a


def run_cluster(workload: Workload, system: str, rate_req_s: float, preset: ReplayPreset,
                spec: ClusterSpec, seed: int = 0) -> RunMetrics:
    """Replay ``workload`` on a cluster; one node is exactly ``run_replay``."""
    if spec.nodes == 1:
        return run_replay(workload, system, rate_req_s, preset, seed)
    return replay_cluster(workload, system, rate_req_s, preset, spec, seed)[0]


def replay_cluster(workload: Workload, system: str, rate_req_s: float,
                   preset: ReplayPreset, spec: ClusterSpec,
                   seed: int = 0) -> tuple[RunMetrics, Cluster]:
    """Like ``run_cluster`` (any node count) but also returns the finished ``Cluster``."""
    cluster = Cluster(workload, system, preset, rate_req_s, spec, seed)
    m = timed_run(cluster.run, cluster.extra_metrics, workload, system, rate_req_s, preset,
                  seed)
    logger.info("%s on %s at %g req/s: %.1f s wall", system, spec.label(), rate_req_s,
                m.wall_s)
    return m, cluster
