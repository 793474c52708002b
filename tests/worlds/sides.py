"""World 3: the vLLM connector's two halves without an engine, one pair per node: the
scheduler half (``SchedulerSide``) keeps the books, the worker half (``WorkerSide``)
moves real bytes between its session files, its arena and a paged KV. This module is
the engine: per event of the replay's log it asks for the hit and admits it (arrival),
hands the worker's report of a restore back (restore done: FC-MAS releases a slot and
the next step starts the next restore), and schedules the turn's store (turn done).
Every step it plans runs at once on the worker; the worker's reports are held until
the replay had that restore or write finish, so the books see them at the same clock
times. Another node is ``peers``: an index double for the scheduler half's
``cluster_side.ClusterLookup`` (an injectable ``index``) and a reader double in the
worker's reader dispatch."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flatcake.cio.names import QUARANTINE_DIR, SESSIONS_DIR
from flatcake.clock import ManualClock
from flatcake.config import FlatCakeConfig
from flatcake.connectors.cluster_side import ClusterLookup
from flatcake.connectors.scheduler_side import RequestView, SchedulerSide
from flatcake.connectors.worker_side import WorkerSide
from flatcake.control.signals import (
    SessionTracker,
    max_branch_blocks,
)
from flatcake.geometry import KVGeometry
from flatcake.plan.tasks import LoadDone, StoreDone, WorkerReport
from flatcake.replay.systems.flatcake import keys_of, make_keys
from tests.worlds.kv import PagedBlocks, rot
from tests.worlds.peers import Owner, PeerIndex, PeerReader
from tests.worlds.replay import Event
from tests.worlds.scenario import BT, Record, Script, tap_fc_mas


def _rid(i: int) -> str:
    return f"r{i}"


def _index(rid: object) -> int | None:
    return int(rid[1:]) if isinstance(rid, str) and rid[:1] == "r" else None


class _Node:
    """One engine's two halves, its paged KV, and the reports not handed back yet."""

    def __init__(self, node: int, root: Path, g: KVGeometry, config: FlatCakeConfig,
                 clock: ManualClock, rec: Record, num_requests: int) -> None:
        config = dataclasses.replace(config, store=dataclasses.replace(config.store,
                                                                       node_id=node))
        self.node, self.root, self.g = node, root, g
        self.worker = WorkerSide(g, config, root)
        self.sched = SchedulerSide(g, config, root, clock=clock)
        names = itertools.count()  # session names that repeat, as the replay's do
        self.sched.sessions = SessionTracker(
            max_sessions=num_requests, new_session_id=lambda: f"auto-{next(names)}",
            max_branch_blocks=max_branch_blocks(config.placement, g))
        self.kv = PagedBlocks(g)
        self.worker.register(self.kv.tensors)
        tap_fc_mas(self.sched.control.scheduler, rec, _index)
        self.outcomes: dict[str, Any] = {}  # the executor's LoadOutcome per request
        submit = self.worker.executor.submit_load

        def recording(task: Any, paged: Any, ready: Any, on_done: Any = None,
                      fence: Any = None) -> Any:
            def done(outcome: Any) -> None:
                self.outcomes[task.request_id] = outcome
                if on_done is not None:
                    on_done(outcome)
            return submit(task, paged, ready, done, fence=fence)

        self.worker.executor.submit_load = recording
        self.loads: dict[str, LoadDone] = {}  # reported by the worker, not handed back
        self.stores: dict[str, StoreDone] = {}
        self.finished: set[str] = set()  # finished since the last poll

    def owner(self) -> Owner:
        arena = self.worker.executor.arena
        return Owner(self.node, self.sched.control, self.root / SESSIONS_DIR,
                     lambda offset, n: arena.view(offset, n).numpy())

    def join(self, peer: Owner, clock: ManualClock) -> None:
        self.sched.cluster = ClusterLookup(self.g, self.sched.config,
                                           index=PeerIndex(peer), now=clock.now)
        reader = PeerReader(peer)
        self.worker.executor.readers.remote_source = \
            lambda medium, node: reader if node == peer.node else None

    def step(self) -> None:
        """One engine step: plan it, run it (sync loads per layer), end it."""
        plan = self.sched.build_step()
        self.worker.start_step(plan)
        for layer in range(self.g.num_layers):
            self.worker.wait_for_layer(layer)
        self.worker.end_step()

    def poll_until(self, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 30
        while not ready():
            assert time.monotonic() < deadline, "the worker reported nothing in 30 s"
            _, _, _, report = self.worker.poll(self.finished)
            self.finished = set()
            self.loads.update((d.request_id, d) for d in report.loads)
            self.stores.update((d.request_id, d) for d in report.stores)
            time.sleep(0.001)


@dataclasses.dataclass
class _Live:
    keys: tuple[bytes, ...]
    blocks: list[int]
    slots: list[int]
    loading: bool = False
    done: LoadDone | None = None


class SidesWorld:
    """Both nodes' connectors following the replay's events."""

    def __init__(self, script: Script, g: KVGeometry, root: Path,
                 config: FlatCakeConfig) -> None:
        self.script = script
        self.g = g
        self.rec = Record()
        self.clock = ManualClock()
        self.wl = script.workload()
        self.keys = make_keys(self.wl.num_ids)
        self.nodes = [_Node(k, root / f"node{k}", g, config, self.clock, self.rec,
                            self.wl.num_requests) for k in (0, 1)]
        for k, n in enumerate(self.nodes):
            n.join(self.nodes[1 - k].owner(), self.clock)
        self.live: dict[int, _Live] = {}
        self._rotted: dict[str, Path] = {}

    def run(self, events: list[Event]) -> Record:
        try:
            for kind, i, t in events:
                self.clock.set(t)
                getattr(self, kind)(i, self.nodes[self.script.steps[i].node])
        finally:
            for n in self.nodes:
                n.worker.close()
                n.sched.close()
        return self.rec

    def arrive(self, i: int, n: _Node) -> None:
        rotted = self.script.rot_before(i)
        if rotted is not None:  # the victim's segment rots in the worker's file
            seg = n.sched.control.segment(
                self.rec.segment_of[self.script.index(rotted.victim)])
            self._rotted[rotted.victim] = rot(n.root / SESSIONS_DIR, seg, rotted.header)
        step = self.script.steps[i]
        runs = self.wl.runs(i)
        keys = keys_of(self.keys, runs)
        live = self.live[i] = _Live(keys, [b for s, e in runs for b in range(s, e)],
                                    n.kv.take_lane())
        v = RequestView(_rid(i), keys, step.input_tokens, step.input_tokens)
        n.sched.new_request(v)
        tokens, _ = n.sched.num_matched_tokens(v, 0)
        assert tokens is not None, f"{step.name}: a store of its prefix is still in flight"
        self.rec.hits[i] = (0, 0, 0, 0)
        if tokens:
            n.sched.after_alloc(_rid(i), live.slots[:len(keys)], tokens)
            live.loading = True
            n.step()  # an all-memory load runs in it; FC-MAS may start an SSD one

    def load_done(self, i: int, n: _Node) -> None:
        """Hand back request ``i``'s restore; when FC-MAS started another one instead,
        that one goes first (the engine hands back what the worker finished)."""
        live = self.live[i]
        while live.loading and live.done is None:
            flying = {str(r.request_id) for r in n.sched.control.scheduler.in_flight()}

            def finished(flying: set[str] = flying) -> str | None:
                if _rid(i) in n.loads:
                    return _rid(i)
                return next((r for r in n.loads if r in flying), None)

            n.poll_until(lambda: finished() is not None)
            rid = finished()
            assert rid is not None
            done = n.loads.pop(rid)
            n.sched.on_report(WorkerReport((), (done,)))
            self.live[int(rid[1:])].done = done
            n.step()  # a slot is free: FC-MAS starts the next restore now

    def complete(self, i: int, n: _Node) -> None:
        step = self.script.steps[i]
        live = self.live[i]
        if live.loading and live.done is None:
            self.load_done(i, n)
        loaded = live.done.num_blocks_loaded if live.done is not None else 0
        keys = live.keys
        assert n.kv.holds(live.slots[:loaded], live.blocks[:loaded])
        n.kv.compute(live.slots[loaded:len(keys)], live.blocks[loaded:])
        v = RequestView(_rid(i), keys, step.input_tokens + step.output_tokens,
                        step.input_tokens, step.output_tokens, step.input_tokens)
        plan = n.sched.prompt_computed(v, live.slots[:len(keys)])
        _, params = n.sched.request_finished(v)
        n.finished.add(_rid(i))
        n.step()  # the worker writes the store after this step's forward pass
        if plan is not None:
            n.poll_until(lambda: _rid(i) in n.stores)
            n.sched.on_report(WorkerReport((n.stores.pop(_rid(i)),), ()))
        self._record(i, n, plan, params)
        n.kv.give_back(live.slots)
        del self.live[i]
        for rotted in self.script.rots:
            if rotted.before == step.name:
                self._after_rot(n, rotted.victim)

    def _record(self, i: int, n: _Node, plan: Any, params: Any) -> None:
        self.rec.placed[i] = None if plan is None else (
            plan.session_id, plan.medium.name, plan.placement.rule.value)
        if plan is not None:
            self.rec.stored_blocks[i] = plan.segment.num_blocks
            self.rec.segment_of[i] = plan.segment.segment_id
            if plan.segment.file_id is not None:
                self.rec.file_of[i] = plan.segment.file_id
        p = params["flatcake"] if params else {}
        mem, ssd, far = (p.get(f"loaded_tokens_{m}", 0) // BT
                         for m in ("memory", "ssd", "remote"))
        self.rec.hits[i] = (mem + ssd + far, mem, ssd, far)
        outcome = n.outcomes.get(_rid(i))
        if outcome is not None and outcome.restore.bytes_read:
            self.rec.reads[i] = (outcome.restore.commands, outcome.restore.bytes_read)
        if outcome is not None and outcome.done.remote_bytes:
            self.rec.remote_bytes[i] = outcome.done.remote_bytes

    def _after_rot(self, n: _Node, victim: str) -> None:
        n.step()  # the file cuts and drops the books decided, on the worker
        placed = self.rec.placed[self.script.index(victim)]
        assert placed is not None
        self.rec.after_rot[victim] = sorted(
            s.segment_id for s in n.sched.control.segments() if s.session_id == placed[0])
        path = self._rotted[victim]
        quarantined = n.root / QUARANTINE_DIR
        self.rec.on_disk[victim] = (
            path.stat().st_size if path.exists() else -1,
            len(list(quarantined.iterdir())) if quarantined.exists() else 0)
