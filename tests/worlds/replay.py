"""World 1: the replay. Two simulated nodes sharing KV (``replay.cluster`` with
``systems.sharing.FlatCakeReads``): node 1 runs only the steps the script puts there.
The system records what it decides (``Record``) and the order things happened (the
event log the other two worlds follow, at the replay's times). The replay does no I/O,
so a segment's rot is the books verb the hosts call when a checksum fails
(``ControlPlane.mark_damaged``), just before the request that reads it arrives."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from flatcake.config import ReclaimConfig
from flatcake.geometry import KVGeometry
from flatcake.replay import cluster as replay_cluster
from flatcake.replay.cluster import Cluster, ClusterSpec
from flatcake.replay.node.node import Node, Request
from flatcake.replay.presets import ReplayPreset
from flatcake.replay.systems.flatcake import FlatCakeSystem
from flatcake.replay.systems.sharing import FlatCakeReads
from tests.replay.helpers import tiny_preset
from tests.worlds.scenario import Record, Script, tap_fc_mas

Event = tuple[str, int, float]  # ("arrive" | "load_done" | "complete", request, time)


def preset(geometry: KVGeometry) -> ReplayPreset:
    """A one-worker node, one restore slot, small host memory and SSD (reclaim).

    Each branch is a session of its own (``branch_tail_tokens=0``): the replay learns
    of a rot before the branch that reads it looks up, the store and the connector
    only when they read it, so a branch joining the session it branches from would
    join a different session in the replay (``tests/connectors/test_branches.py``
    covers the rule itself)."""
    p = tiny_preset(gpu_blocks=200, host_blocks=40, ssd_blocks=150, geometry=geometry,
                    slots=1)
    fc = dataclasses.replace(
        p.flatcake, store=dataclasses.replace(p.flatcake.store, session_file_bytes=1 << 20),
        placement=dataclasses.replace(p.flatcake.placement, branch_tail_tokens=0),
        reclaim=ReclaimConfig(ssd_high=0.9, ssd_low=0.5, memory_high=0.9, memory_low=0.5))
    return dataclasses.replace(p, flatcake=fc)


class _Routed(Cluster):
    """The script's routing; counts what each remote fetch moved."""

    def __init__(self, script: Script, *args: Any) -> None:
        self.script = script
        # Per fetch: the owner's SSD commands and bytes, and its memory bytes.
        self.fetches: list[tuple[int, int, int, int]] = []
        super().__init__(*args)

    def route(self, i: int) -> Node:
        return self.nodes[self.script.steps[i].node]

    def fetch(self, node: int, worker: int, owner: int, ssd_commands: int, ssd_bytes: int,
              memory_bytes: int, blocks: int, wire_bytes: int | None = None) -> float:
        wire = ssd_bytes + memory_bytes if wire_bytes is None else wire_bytes
        self.fetches.append((ssd_commands, ssd_bytes, memory_bytes, wire))
        return super().fetch(node, worker, owner, ssd_commands, ssd_bytes, memory_bytes,
                             blocks, wire_bytes)


class Recorded(FlatCakeSystem):
    """The replay's FlatCake on one node, recording into ``rec`` and ``events``."""

    def __init__(self, *args: Any, script: Script, events: list[Event], rec: Record,
                 **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.script = script
        self.events = events
        self.rec = rec  # every node's, by request index
        self._storing = -1

    def attach(self, node: Node) -> None:
        super().attach(node)
        cp = self.cp
        assert cp is not None
        tap_fc_mas(self.drivers[0].fcmas, self.rec,
                   lambda rid: rid if isinstance(rid, int) else None)
        prepare_store = cp.prepare_store

        def recording_store(session_id: str, keys: Any, **kw: Any) -> Any:
            plan = prepare_store(session_id, keys, **kw)
            i = self._storing
            self.rec.placed[i] = None if plan is None else (
                session_id, plan.medium.name, plan.placement.rule.value)
            if plan is not None:
                self.rec.stored_blocks[i] = plan.segment.num_blocks
                self.rec.segment_of[i] = plan.segment.segment_id
                if plan.segment.file_id is not None:
                    self.rec.file_of[i] = plan.segment.file_id
            return plan

        cp.prepare_store = recording_store

    def on_arrival(self, req: Request) -> None:
        assert self.node is not None and self.cp is not None
        rot = self.script.rot_before(req.idx)
        if rot is not None and req.sys is None:
            # What a host's ``finish_load`` marks when the segment fails its checksum
            # (and the executor finds the file header damaged too).
            self.cp.mark_damaged(self.rec.segment_of[self.script.index(rot.victim)],
                                 header_damaged=rot.header)
        gpu = self.node.workers[req.worker].gpu
        gpu.drop(gpu.size)  # no GPU prefix: the other worlds restore every hit whole
        self.events.append(("arrive", req.idx, self.node.now))
        super().on_arrival(req)
        st = req.sys
        if st is None:  # waits for a store in flight; arrives again once it is durable
            self.events.remove(("arrive", req.idx, self.node.now))
            return
        # A restore with a remote part (the shared variant's state) keeps this node's
        # part (None: nothing here) apart from the owners' pieces.
        pieces = getattr(st, "pieces", ())
        remote = sum(whole.num_blocks for _, whole, _ in pieces)
        local = st.local if pieces else st.hit
        mem, ssd = (0, 0) if local is None else (local.num_memory_blocks,
                                                 local.num_ssd_blocks)
        self.rec.hits[req.idx] = (mem + ssd + remote, mem, ssd, remote)

    def _start_restore(self, req: Request) -> None:
        assert self.node is not None
        rec = self.node.rec
        fetched = len(self.node.cluster.fetches)
        before = (rec.ssd_read_commands, rec.ssd_read_bytes, self.read_check_bytes,
                  self.read_gap_bytes)
        super()._start_restore(req)
        far = self.node.cluster.fetches[fetched:]
        commands = rec.ssd_read_commands - before[0] - sum(f[0] for f in far)
        nbytes = rec.ssd_read_bytes - before[1] - sum(f[1] for f in far)
        if nbytes:
            self.rec.reads[req.idx] = (commands, nbytes)
        if far:
            self.rec.remote_bytes[req.idx] = sum(f[3] for f in far)  # what crossed the NIC
        self.rec.accounted[req.idx] = (rec.ssd_read_bytes - before[1], 0,
                                       self.read_check_bytes - before[2],
                                       self.read_gap_bytes - before[3])

    def prefill_load(self, req: Request, worker: Any) -> tuple[int, float]:
        assert self.node is not None
        if req.sys.load_pinned:  # an all-memory hit: copied as its prefill starts
            self.events.append(("load_done", req.idx, self.node.now))
        return super().prefill_load(req, worker)

    def restore_done(self, arg: tuple[Request, int]) -> None:
        assert self.node is not None
        req, useful = arg
        self.events.append(("load_done", req.idx, self.node.now))
        read, _, check, gap = self.rec.accounted[req.idx]
        self.rec.accounted[req.idx] = (read, useful, check, gap)
        super().restore_done(arg)

    def on_complete(self, req: Request) -> None:
        assert self.node is not None and self.cp is not None
        self._storing = req.idx
        self.events.append(("complete", req.idx, self.node.now))
        super().on_complete(req)
        for rot in self.script.rots:
            if self.script.steps[req.idx].name == rot.before:
                placed = self.rec.placed[self.script.index(rot.victim)]
                assert placed is not None
                self.rec.after_rot[rot.victim] = sorted(
                    s.segment_id for s in self.cp.segments() if s.session_id == placed[0])


@dataclasses.dataclass
class ReplayWorld:
    """The replay's record, its event log (in the order things happened) and nodes."""

    rec: Record
    events: list[Event]
    nodes: list[Recorded]
    cluster: Cluster


def run_replay(script: Script, geometry: KVGeometry) -> ReplayWorld:
    p = preset(geometry)
    events: list[Event] = []
    rec = Record()

    def make_system(name: str, config: Any, tiered: Any, shared: bool = False) -> Recorded:
        return Recorded(config, name, FlatCakeReads, script=script, events=events, rec=rec)

    wl = script.workload()
    with pytest.MonkeyPatch.context() as mp:
        # The cluster builds each node's system by name: make it the recording one.
        mp.setattr(replay_cluster, "make_system", make_system)
        cluster = _Routed(script, wl, "flatcake", p, 0.1, ClusterSpec(nodes=2))
    cluster.run()
    assert sum(n.num_done for n in cluster.nodes) == wl.num_requests
    systems = [n.system for n in cluster.nodes]
    assert all(isinstance(s, Recorded) for s in systems)
    return ReplayWorld(rec, events, systems, cluster)
