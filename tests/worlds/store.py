"""World 2: ``FlatCakeStore``, real bytes in a temporary directory, one store per node.

The host's part (an engine's, or the connector's) by hand: sessions and refcounts from
``control.signals``, the clock at the replay's times, each event (arrival, restore
done, turn done) where the replay had it. A restore the store starts is held at its
executor until the replay's restore of that request is done, so FC-MAS decides with
the same queue at the same clock times as the replay's; a hit is checked byte for byte.
Another node's blocks come through ``peers`` (no Redis, no NIXL): the store has no
public seam for them, so its ``_cluster`` and its executor's reader dispatch are set
from here, as ``store.cluster.StoreCluster`` sets them."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flatcake.cio.names import QUARANTINE_DIR, SESSIONS_DIR
from flatcake.clock import ManualClock
from flatcake.config import FlatCakeConfig
from flatcake.control.signals import (
    PrefixRefcount,
    SessionTracker,
    TurnInfo,
    hit_owner,
    max_branch_blocks,
)
from flatcake.geometry import KVGeometry
from flatcake.replay.systems.flatcake import keys_of, make_keys
from flatcake.store import FlatCakeStore, TurnSignals
from flatcake.store.restores import LoadHandle
from flatcake.store.results import LoadResult
from tests.worlds.kv import PagedBlocks, rot
from tests.worlds.peers import Owner, PeerIndex, PeerReader, StoreClusterDouble
from tests.worlds.replay import Event
from tests.worlds.scenario import BT, Record, Script, tap_fc_mas


class _Held:
    """The executor's ``submit_load``, holding each load until ``run`` lets it go."""

    def __init__(self, executor: Any) -> None:
        self._submit = executor.submit_load
        self.pending: dict[str, tuple[Any, ...]] = {}  # in the order the store started them
        executor.submit_load = self._hold

    def _hold(self, task: Any, *args: Any) -> Future[Any]:
        self.pending[task.request_id] = (task, *args)
        return Future()  # the store waits on its own future, not this one

    def run(self, request_id: str) -> None:
        self._submit(*self.pending.pop(request_id))


@dataclass
class _Live:
    turn: TurnInfo
    keys: tuple[bytes, ...]
    blocks: list[int]
    slots: list[int]
    handle: LoadHandle | None = None
    result: LoadResult | None = None
    recorded: bool = False


class _Node:
    """One store and its host's books."""

    def __init__(self, node: int, root: Path, g: KVGeometry, config: FlatCakeConfig,
                 clock: ManualClock, rec: Record, num_requests: int) -> None:
        config = dataclasses.replace(config, store=dataclasses.replace(config.store,
                                                                       node_id=node))
        self.node = node
        self.root = root
        self.store = FlatCakeStore.open(root, g, config, clock=clock)
        self.control = self.store.control
        names = itertools.count()
        self.sessions = SessionTracker(max_sessions=num_requests,
                                       new_session_id=lambda: f"auto-{next(names)}",
                                       max_branch_blocks=max_branch_blocks(config.placement, g))
        self.refcount = PrefixRefcount()
        self.kv = PagedBlocks(g)
        self.held = _Held(self.store._exec)
        self.ids: dict[Hashable, int] = {}  # the store's request ids -> script index
        self.starting = -1  # the request whose load is being started
        self.live: dict[int, _Live] = {}
        tap_fc_mas(self.control.scheduler, rec,
                   lambda rid: self.ids.setdefault(rid, self.starting))

    def owner(self) -> Owner:
        arena = self.store.arena
        return Owner(self.node, self.control, self.root / SESSIONS_DIR,
                     lambda offset, n: arena.view(offset, n).numpy())

    def join(self, peer: Owner) -> None:
        self.cluster = StoreClusterDouble(PeerIndex(peer))
        self.store._cluster = self.cluster
        reader = PeerReader(peer)
        self.store._exec.readers.remote_source = \
            lambda medium, node: reader if node == peer.node else None

    def settle(self, i: int) -> LoadResult | None:
        """Let request ``i``'s held load run and wait for it; when the store started
        another one in its place, that one runs first (the store's order)."""
        live = self.live[i]
        while live.handle is not None and not live.handle.done():
            rid = next((r for r, k in self.ids.items() if k == i and r in self.held.pending),
                       next(iter(self.held.pending), None))
            assert rid is not None, f"request {i}: its load is neither held nor running"
            self.held.run(str(rid))
            other = self.live[self.ids[rid]]
            assert other.handle is not None
            other.result = other.handle.wait(30)
        if live.handle is not None and live.result is None:
            live.result = live.handle.wait(30)
        return live.result


class StoreWorld:
    """Both nodes' stores following the replay's events (see the module docstring)."""

    def __init__(self, script: Script, g: KVGeometry, root: Path,
                 config: FlatCakeConfig) -> None:
        self.script = script
        self.g = g
        self.rec = Record()
        self.clock = ManualClock()
        wl = script.workload()
        self.wl = wl
        self.keys = make_keys(wl.num_ids)
        self.nodes = [_Node(k, root / f"node{k}", g, config, self.clock, self.rec,
                            wl.num_requests) for k in (0, 1)]
        self.nodes[0].join(self.nodes[1].owner())
        self.nodes[1].join(self.nodes[0].owner())
        self._rotted: dict[str, Path] = {}

    def run(self, events: list[Event]) -> Record:
        try:
            for kind, i, t in events:
                self.clock.set(t)
                getattr(self, kind)(i, self.nodes[self.script.steps[i].node])
        finally:
            for n in self.nodes:
                for rid in list(n.held.pending):
                    n.held.run(rid)
                n.store.close()
        return self.rec

    def arrive(self, i: int, n: _Node) -> None:
        step = self.script.steps[i]
        rotted = self.script.rot_before(i)
        if rotted is not None:  # the victim's segment rots on disk between turns
            seg = n.control.segment(self.rec.segment_of[self.script.index(rotted.victim)])
            self._rotted[rotted.victim] = rot(n.root / SESSIONS_DIR, seg, rotted.header)
        runs = self.wl.runs(i)
        keys = keys_of(self.keys, runs)
        hit = n.control.lookup(keys)
        far = n.cluster.remote(keys, hit.num_blocks, self.g.layer_block_bytes)
        # As the connector: the history is everything the cluster holds of the prompt.
        end = far[-1].end if far else hit.num_blocks
        turn = n.sessions.resolve(None, end, hit_owner(n.control, hit))
        n.refcount.add(i, keys)
        live = n.live[i] = _Live(turn, keys, [b for s, e in runs for b in range(s, e)],
                                 n.kv.take_lane())
        self.rec.hits[i] = (0, 0, 0, 0)
        if hit.num_blocks or far:
            n.starting = i
            live.handle = n.store.start_load(keys, n.kv.tensors, live.slots[:len(keys)])
        assert len(step.blocks) == len(keys)

    def load_done(self, i: int, n: _Node) -> None:
        assert self._loaded(i, n) is not None, f"{self.script.steps[i].name}: no load"

    def _loaded(self, i: int, n: _Node) -> LoadResult | None:
        """Request ``i``'s load once done (recorded once), None when it had none."""
        res = n.settle(i)
        live = n.live[i]
        if res is None or live.recorded:
            return res
        live.recorded = True
        assert n.kv.holds(live.slots[:res.num_blocks], live.blocks[:res.num_blocks])
        self.rec.hits[i] = (res.num_blocks, res.num_memory_blocks, res.num_ssd_blocks,
                            res.num_remote_blocks)
        if res.bytes_read:
            self.rec.reads[i] = (res.commands, res.bytes_read)
        if res.remote_bytes:
            self.rec.remote_bytes[i] = res.remote_bytes
        return res

    def complete(self, i: int, n: _Node) -> None:
        step = self.script.steps[i]
        live = n.live[i]
        res = self._loaded(i, n)
        loaded = res.num_blocks if res is not None else 0
        keys = live.keys
        # The prefill computed what the load did not bring (a damaged tail included).
        n.kv.compute(live.slots[loaded:len(keys)], live.blocks[loaded:])
        start = max(min(loaded, len(keys) - 1), 0)
        turn = live.turn
        signals = TurnSignals(turn.turn_index, step.input_tokens, turn.prev_reply_tokens,
                              n.refcount.refcount(keys[start]))
        out = n.store.store_turn(turn.session_id, keys, n.kv.tensors,
                                 live.slots[:len(keys)], signals)
        self.rec.placed[i] = None if out.medium is None else (
            turn.session_id, out.medium.name, out.rule)
        if out.medium is not None:
            self.rec.stored_blocks[i] = out.num_blocks
            loc = n.control.locate(keys[out.first_block])
            assert loc is not None
            self.rec.segment_of[i] = loc.segment.segment_id
            if loc.segment.file_id is not None:
                self.rec.file_of[i] = loc.segment.file_id
        n.sessions.finish_turn(turn, step.output_tokens,
                               min(len(keys), step.input_tokens // BT))
        n.refcount.remove(i)
        n.kv.give_back(live.slots)
        del n.live[i]
        for rotted in self.script.rots:
            if rotted.before == step.name:
                self._after_rot(n, rotted.victim)

    def _after_rot(self, n: _Node, victim: str) -> None:
        placed = self.rec.placed[self.script.index(victim)]
        assert placed is not None
        self.rec.after_rot[victim] = sorted(s.segment_id for s in n.control.segments()
                                            if s.session_id == placed[0])
        path = self._rotted[victim]
        quarantined = n.root / QUARANTINE_DIR
        self.rec.on_disk[victim] = (
            path.stat().st_size if path.exists() else -1,
            len(list(quarantined.iterdir())) if quarantined.exists() else 0)
