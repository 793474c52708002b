"""Systems whose nodes share KV in a simulated cluster (``replay.cluster``).

Each node keeps its own store; ``join`` gives it the cluster and the other nodes'
stores, which stand for the cluster index (a store only finds what another node has
published, and FlatCake publishes a segment after its write is durable). A request
looks up its own node first; the blocks past the local hit are looked for block by
block as ``replay.cluster`` describes, read from their owners with ``Cluster.fetch``
(owner's SSD, the requesting worker's NIC) and are hits like local ones. Nothing is
copied to the requesting node: what it stores after the turn is what the cluster did
not hold, so a session's history ends up spread over the nodes that ran its turns.
The requester's own part of a restore fills memory copies exactly as on one node
(``placement.copy_on_restore``: the same ``prepare_load(refill=True)`` and the same
wait for the copies); blocks read from other nodes fill none, as in the store.

Both are collaborators a node's system is built with (``sharing=``) and calls at the
points where a cluster changes what it does (an arrival past the local hit, the start
and the end of a restore it took over, which blocks a finished turn puts); a run with
one node builds none.

* ``FlatCakeReads``: the books of every node are the real ``ControlPlane``; a restore
  pins the owner's sessions (``prepare_load`` on the owner) until it ends and reads each
  owner's part with the owner's plan (whole SSD segments, for the requester's checksum
  check), all through the worker's FC-MAS queues like a local restore.
* ``TieredReads``: Mooncake Store's lookup is cluster-wide (its master knows
  every replica): blocks in another node's host tier or SSD buckets are read by their
  owner (one object per block from its bucket) and sent over the NIC; a finished turn
  puts only blocks no node holds (``Put`` skips existing keys).

In a cluster of one node both leave every request to their system.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flatcake.control.address import Medium
from flatcake.control.index import HitRun, PrefixHit, trim_hit
from flatcake.control.scheduler import RestoreRequest
from flatcake.control.windows import delivered_bytes, restore_view
from flatcake.plan.bulk import stream_totals
from flatcake.readplan import ReadPlan
from flatcake.replay.node.node import Request, not_attached
from flatcake.replay.systems.flatcake import FlatCakeSystem
from flatcake.replay.systems.state import FcState, HostTier, TState
from flatcake.replay.systems.tiered import TieredSystem
from flatcake.replay.workload.runs import Runs, runs_len, slice_runs


def _hit_of(runs: list[HitRun]) -> PrefixHit | None:
    """The pieces of one store as a hit to pin and plan (positions may have gaps)."""
    if not runs:
        return None
    n = sum(r[2] for r in runs)
    mem = sum(r[2] for r in runs if r[0].medium is Medium.MEMORY)
    return PrefixHit(n, mem, n - mem, tuple(runs))


class _SharedState(FcState):
    __slots__ = ("local", "local_plan", "pieces")

    def __init__(self, hit: PrefixHit, keys: tuple[bytes, ...], turn: Any) -> None:
        super().__init__(hit, keys, turn)
        self.local: PrefixHit | None = None  # this node's pieces
        self.local_plan: ReadPlan | None = None
        # (owner node, its pieces, its plan at arrival)
        self.pieces: list[tuple[int, PrefixHit, ReadPlan]] = []


class _Member:
    """A node's place in its cluster: set by ``join`` once every node exists."""

    def __init__(self) -> None:
        self.cluster: Any = None
        self.me = 0
        self.peers: list[Any] = []  # every node's system, this one's included
        self.num_remote_restores = 0

    def join(self, cluster: Any, me: int) -> None:
        self.cluster = cluster
        self.me = me
        self.peers = [node.system for node in cluster.nodes]

    def sharing(self) -> bool:
        """Whether other nodes exist to read from."""
        return self.cluster is not None and len(self.peers) > 1

    def metrics(self) -> dict[str, Any]:
        return {"remote_restores": self.num_remote_restores}


class FlatCakeReads(_Member):
    """What FlatCake on one node of a cluster that shares KV reads from the others."""

    def __init__(self, system: FlatCakeSystem) -> None:
        super().__init__()
        self.system = system

    def walk(self, keys: tuple[bytes, ...], hit: PrefixHit
             ) -> tuple[int, list[HitRun], dict[int, list[HitRun]]]:
        """The cluster's hit from the end of the local ``hit``: its length, this node's
        runs and each other node's runs (request positions)."""
        n = len(keys)
        p = hit.num_blocks
        me = self.me
        local = list(hit.runs)
        remote: dict[int, list[HitRun]] = {}
        books = [peer.cp for peer in self.peers]
        while p < n:
            key = keys[p]
            owner = -1
            owner_mem = False
            for k, peer_books in enumerate(books):
                loc = peer_books.locate(key) if peer_books is not None else None
                if loc is None:
                    continue
                if k == me:
                    owner = k
                    break
                mem = loc.segment.medium is Medium.MEMORY
                if owner < 0 or (mem and not owner_mem):
                    owner, owner_mem = k, mem
            cp = self.peers[owner].cp if owner >= 0 else None
            if cp is None:
                break
            part = cp.lookup(keys[p:])
            if not part.num_blocks:
                break
            dest = local if owner == me else remote.setdefault(owner, [])
            dest.extend(HitRun(seg, j, c, s + p) for seg, j, c, s in part.runs)
            p += part.num_blocks
        return p, local, remote

    def _pin_id(self, req: Request) -> tuple[str, int, int]:
        return ("peer", self.me, req.idx)

    def arrive(self, req: Request, keys: tuple[bytes, ...], hit: PrefixHit, g: int) -> bool:
        fc = self.system
        if not self.sharing() or fc.node is None or fc.cp is None:
            return False
        total, local, remote = self.walk(keys, hit)
        if not remote:
            return False
        node, cp = fc.node, fc.cp
        merged = sorted([*local, *(r for runs in remote.values() for r in runs)],
                        key=lambda r: r[3])
        mem = sum(r[2] for r in merged if r[0].medium is Medium.MEMORY)
        st = _SharedState(PrefixHit(total, mem, total - mem, tuple(merged)), keys,
                          fc.turn(req, total, hit))
        req.sys = st
        if total <= g:
            fc.submit(req, RestoreRequest(req.idx, req.arrival_s, 0, False))
            node.make_ready(req)
            return True
        st.gpu_prefix = g
        local_plan = None
        local_hit = _hit_of(local)
        if local_hit is not None:
            part = _hit_of(list(trim_hit(local_hit, g)))
            if part is not None:
                # The local part fills memory copies as a one-node restore does
                # (``placement.copy_on_restore``); what the owners send is not copied.
                local_plan = cp.prepare_load(req.idx, part, planner=fc.planner,
                                             refill=True)
                st.local, st.local_plan, st.load_pinned = local_hit, local_plan.read_plan, True
                st.refills = tuple(home.segment_id for home, _ in local_plan.refills)
                st.refill_bytes = sum(copy.total_bytes for _, copy in local_plan.refills)
        far_blocks = 0
        for owner, runs in remote.items():
            peer = self.peers[owner]
            whole = _hit_of(runs)
            part = _hit_of(list(trim_hit(whole, g))) if whole is not None else None
            if whole is None or part is None or peer.cp is None:
                continue
            lp = peer.cp.prepare_load(self._pin_id(req), part, planner=peer.planner)
            st.pieces.append((owner, whole, lp.read_plan))
            far_blocks += part.num_blocks
        self.num_remote_restores += 1
        # FC-MAS weighs it as the store and the connector do: the local SSD bytes plus
        # every block the owners send.
        rr = cp.restore_request(req.idx, req.arrival_s, local_plan, far_blocks)
        fc.submit(req, rr, local_plan)
        if not rr.needs_ssd:
            # What the owners hold is on the GPU already, the rest is in local memory:
            # it runs at once, as a one-node all-memory hit does (its memory copy
            # overlaps its prefill; ``prefill_load`` unpins it).
            node.make_ready(req)
            return True
        fc.pump(req.worker)
        return True

    def start(self, req: Request) -> bool:
        st = req.sys
        if not isinstance(st, _SharedState):
            return False
        fc = self.system
        node = fc.node
        if node is None:
            raise not_attached(fc.name)
        w = node.workers[req.worker]
        g = req.gpu_prefix
        num_layers = (fc.geometry or node.geometry).num_layers
        end = node.now
        useful = 0
        if st.local is not None:
            runs = trim_hit(st.local, g)
            plan = st.local_plan if g == st.gpu_prefix and st.local_plan is not None \
                else stream_totals(restore_view(runs), num_layers, fc.config.planner,
                                   segment_cache=fc.segment_cache)
            end = fc.charge(w, plan, st.refill_bytes)
            useful += self._account(plan, runs, st.hit.num_blocks)
        for owner, whole, plan0 in st.pieces:
            peer = self.peers[owner]
            runs = trim_hit(whole, g)
            if not runs:
                continue
            plan = plan0 if g == st.gpu_prefix else stream_totals(
                restore_view(runs), num_layers, peer.config.planner,
                segment_cache=peer.segment_cache)
            cmds = plan.num_commands * node.spec.gpus_per_worker if plan.bytes_read else 0
            # The owner reads with its padding and gaps; whole segment layers cross the
            # network (a cluster record carries one crc32 per layer, not the block
            # table), as the remote readers send them.
            wire_ssd = sum({r[0].segment_id: r[0].layout.data_bytes for r in runs
                         if r[0].medium is Medium.SSD}.values())
            end = max(end, self.cluster.fetch(self.me, req.worker, owner, cmds,
                                              plan.bytes_read, plan.memory_bytes,
                                              sum(r[2] for r in runs),
                                              wire_bytes=wire_ssd + plan.memory_bytes))
            useful += self._account(plan, runs, st.hit.num_blocks)
        st.local_plan = None
        req.restore_blocks = max(st.hit.num_blocks - g, 0)
        node.loop.at(end + node.spec.restore_overhead_s, fc.restore_done, (req, useful))
        return True

    def _account(self, plan: ReadPlan, runs: tuple[HitRun, ...], end: int) -> int:
        """Book where ``plan``'s SSD bytes go, as a one-node restore does (gaps and
        padding, the segments' other blocks read for the checksum); returns the SSD
        bytes the request wanted (``windows.delivered_bytes``, its hit ending at ``end``)."""
        wanted = delivered_bytes(runs, end)
        self.system.read_gap_bytes += plan.gap_bytes
        self.system.read_check_bytes += plan.useful_bytes - wanted
        return wanted

    def release(self, req: Request) -> bool:
        st = req.sys
        if not isinstance(st, _SharedState):
            return False
        fc = self.system
        if st.load_pinned and fc.cp is not None:
            fc.cp.complete_load(req.idx, st.refills)
        st.load_pinned = False
        for owner, _whole, _plan in st.pieces:
            peer = self.peers[owner]
            if peer.cp is not None:
                peer.cp.complete_load(self._pin_id(req))
                peer.settle_books()
        st.pieces = []
        fc.settle_books()
        return True


class _SharedTState(TState):
    __slots__ = ("remote",)

    def __init__(self) -> None:
        super().__init__()
        self.remote = True


class TieredReads(_Member):
    """What ``tiered-direct`` on one node of a cluster that shares KV reads from the
    others, and which blocks it leaves to them."""

    def __init__(self, system: TieredSystem) -> None:
        super().__init__()
        self.system = system

    def _held(self, s: int, e: int) -> tuple[np.ndarray, np.ndarray]:
        """Per node, which of blocks ``[s, e)`` it holds in host memory / at all."""
        host = np.stack([_host_tier(p).lru.tick[s:e] != 0 for p in self.peers])
        held = host | np.stack([p.bucket_of[s:e] >= 0 for p in self.peers])
        return host, held

    def extend(self, runs: Runs, start: int) -> tuple[int, dict[int, list[int]]]:
        """From request block ``start`` on, the run of blocks some node holds: its
        length and, per owner, ``[host blocks, SSD blocks]`` (this node's included)."""
        me = self.me
        out: dict[int, list[int]] = {}
        total = 0
        for s, e in slice_runs(runs, start, 1 << 62):
            host, held = self._held(s, e)
            anywhere = held.any(axis=0)
            stop = not anywhere.all()
            n = int(np.argmin(anywhere)) if stop else e - s
            if n:
                host, held = host[:, :n], held[:, :n]
                others = np.delete(np.arange(len(self.peers)), me)
                # Local first, then host memory before SSD, then the lowest node id.
                mem_owner = others[np.argmax(host[others], axis=0)]
                mem_any = host[others].any(axis=0)
                ssd_owner = others[np.argmax(held[others], axis=0)]
                owner = np.where(held[me], me, np.where(mem_any, mem_owner, ssd_owner))
                in_host = host[owner, np.arange(n)]
                for k in np.unique(owner):
                    mine = owner == k
                    got = out.setdefault(int(k), [0, 0])
                    got[0] += int(np.count_nonzero(mine & in_host))
                    got[1] += int(np.count_nonzero(mine & ~in_host))
            total += n
            if stop:
                break
        return total, out

    def arrive(self, req: Request, end: int) -> bool:
        node = self.system.node
        if node is None or not self.sharing():
            return False
        _more, owners = self.extend(req.runs, end)
        if not any(k != self.me for k in owners):
            return False
        req.sys = _SharedTState()
        req.restore_start_s = node.now
        self.num_remote_restores += 1
        node.admit_or_wait(req, self.system.start_io)
        return True

    def start(self, req: Request) -> bool:
        ts = self.system
        st = req.sys
        node = ts.node
        if not isinstance(st, _SharedTState) or node is None:
            return False
        w = node.workers[req.worker]
        g = req.gpu_prefix
        total, _host, ssd = ts.plan_read(req.runs, g)
        s = runs_len(ssd)
        more, owners = self.extend(req.runs, g + total) if g + total < req.num_blocks \
            else (0, {})
        mine = owners.pop(self.me, [0, 0])
        tails = self.window_tail(req.runs, g, g + total + more)
        tail = tails.pop(self.me, [0, 0])
        local_ssd = s + mine[1]
        end = ts.read_local(w, total - s + mine[0], local_ssd, (tail[0], tail[1]))
        bb = node.block_bytes
        wb = ts.peer.window_bytes
        remote_ssd = window_ssd = tail[1]
        for k, (hm, sm) in owners.items():
            # The window blocks at the hit's end that ``k`` sends bring their windowed
            # layers: from its host memory, or from SSD in its objects (vLLM's rule
            # keeps them in every object already; SGLang's in window objects of their own).
            wh, ws = tails.get(k, (0, 0))
            peer = self.peers[k]
            win_obj = 0 if peer.peer.every_block else ws
            cmds = (sm + win_obj) * ts.gpw
            end = max(end, self.cluster.fetch(
                self.me, req.worker, k, cmds, sm * peer.obj_bytes + win_obj * peer.win_obj_bytes,
                hm * bb + wh * wb, hm + sm))
            remote_ssd += sm
            window_ssd += ws
        req.restore_blocks = total + more
        ssd_blocks = local_ssd + remote_ssd
        node.loop.at(end + node.spec.restore_overhead_s, ts.restore_done,
                     (req, ssd_blocks, ssd_blocks * bb + window_ssd * wb))
        return True

    def window_tail(self, runs: Runs, start: int, end: int) -> dict[int, list[int]]:
        """Per node, ``[host blocks, SSD blocks]`` of the window blocks at the end of a
        hit on blocks ``[start, end)`` (its last ``PeerBlocks.window_blocks``), each read
        from the node ``extend`` reads it from."""
        w = self.system.peer.window_blocks
        if not w or end <= start:
            return {}
        _n, tails = self.extend(slice_runs(runs, 0, end), max(start, end - w))
        return tails

    def to_put(self, s: int, e: int) -> np.ndarray | None:
        if not self.sharing():
            return None
        host, held = self._held(s, e)
        elsewhere = np.delete(held, self.me, axis=0).any(axis=0)
        # A refresh of this node's host copy, or a block no node holds.
        return host[self.me] | (~held[self.me] & ~elsewhere)


def _host_tier(system: TieredSystem) -> HostTier:
    if system.host is None:
        raise not_attached(system.name)
    return system.host
