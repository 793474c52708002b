"""The scheduler half's cluster lookup (``connectors.cluster_side``) over an in-process
index: chunked lookups, per-request reuse, back-off after a failure, and the load task
of a hit that continues on another node. The real index is in tests/cluster."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flatcake.connectors.cluster_side import ClusterLookup
from flatcake.control.address import Medium, encode_address
from flatcake.plan.requests import load, restore_request
from tests.connectors.sides_harness import G, Harness, finish, settings, tokens, view


@dataclass(frozen=True)
class Hit:
    node: int
    segment_id: int
    position: int
    record: dict[str, Any]


class Index:
    """Node 2 holds ``held`` keys, all in one memory segment; ``down`` fails lookups."""

    def __init__(self, held: Sequence[bytes]) -> None:
        self.held = {k: i for i, k in enumerate(held)}
        self.record = {"base": encode_address(Medium.MEMORY, 2, 0), "nb": len(held),
                       "nl": G.num_layers, "bbpl": G.block_bytes_per_layer, "hdr": 0,
                       "file": "", "foff": 0, "crcs": [0] * G.num_layers}
        self.asked: list[int] = []
        self.failures = 0
        self.down = False

    def lookup(self, keys: Sequence[bytes], *, prefix: bool = True) -> list[Hit]:
        self.asked.append(len(keys))
        if self.down:
            self.failures += 1
            return []
        hits = []
        for key in keys:
            if key not in self.held:
                break
            hits.append(Hit(2, 7, self.held[key], self.record))
        return hits

    def close(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def keys(n: int, start: int = 0) -> tuple[bytes, ...]:
    return tuple(i.to_bytes(32, "big") for i in range(start, start + n))


def test_lookups_grow_in_chunks_and_a_miss_costs_one_small_one() -> None:
    index, clock, stats = Index(keys(50)), Clock(), Counter[str]()
    look = ClusterLookup(G, settings(), index=index, now=clock, stats=stats)
    runs = look.runs("a", keys(60), 0)
    assert [(r.request_start, r.start_pos, r.count, r.node) for r in runs] == [(0, 0, 50, 2)]
    assert index.asked == [8, 32, 20]
    index.asked.clear()
    assert look.runs("b", keys(60, start=100), 0) == () and index.asked == [8]
    # After the local prefix: from block 10 on.
    index.asked.clear()
    assert [(r.request_start, r.start_pos, r.count) for r in look.runs("c", keys(50), 10)] \
        == [(10, 10, 40)]
    assert look.runs("d", keys(50), 50) == () and stats["cluster_lookup_failures"] == 0


def test_a_request_reuses_its_runs_and_a_failure_backs_off() -> None:
    index, clock, stats = Index(keys(20)), Clock(), Counter[str]()
    look = ClusterLookup(G, settings("engine.cluster_lookup_retry_s=5",
                                     "engine.cluster_lookup_fresh_s=1"),
                         index=index, now=clock, stats=stats)
    first = look.runs("a", keys(20), 0)
    asked = len(index.asked)
    assert look.runs("a", keys(20), 0) == first and len(index.asked) == asked
    clock.t = 1.5  # stale: asked again
    assert look.runs("a", keys(20), 0) == first and len(index.asked) > asked
    index.down = True
    assert look.runs("b", keys(20), 0) == () and stats["cluster_lookup_failures"] == 1
    asked = len(index.asked)
    clock.t = 4.0  # backing off: local-only without asking
    assert look.runs("c", keys(20), 0) == () and len(index.asked) == asked
    index.down = False
    clock.t = 7.0
    assert look.runs("c", keys(20), 0) == first and look.lookups == 4


def test_remote_task_loads_after_the_local_hit_or_the_engines_own_prefix(
        tmp_path: Path) -> None:
    h = Harness(tmp_path)
    turn0 = list(range(100, 113))  # 3 blocks stored here
    finish(h, "a", turn0, [5, 6, 7, 8], out=3, session="s")
    h.step()
    v = view("b", tokens(turn0, 20, 200))  # 8 blocks: 3 here, 5 more on node 2
    index = Index(v.keys[3:8])
    look = ClusterLookup(G, settings(), index=index)
    control = h.sched.control
    hit = control.lookup(v.keys)
    far = look.runs("b", v.keys, hit.num_blocks)
    slots = list(range(20, 30))
    task, plan = load(control, "b", hit, slots, 1, far)
    assert (task.first_block, task.num_blocks, task.remote_end, task.sync) == (1, 3, 8, False)
    assert task.block_ids == tuple(slots[:8])
    # FC-MAS weighs it as every host does: the local SSD bytes + the 5 remote blocks.
    rr = restore_request(control, task, plan, 0.0)
    assert rr.needs_ssd and rr.kv_bytes == plan.read_plan.useful_bytes + 5 * (
        G.num_layers * G.block_bytes_per_layer)
    control.complete_load("b")
    # The engine computed 5 blocks itself: nothing local is read, remote from block 5.
    task, plan = load(control, "c", hit, slots, 5, far)
    assert (task.first_block, task.num_blocks, task.remote_end) == (5, 5, 8)
    assert [(r.request_start, r.start_pos, r.count) for r in task.remote] == [(5, 2, 3)]
    assert plan.hit.num_blocks == 0  # nothing of the local hit pinned or read
    assert restore_request(control, task, plan, 0.0).kv_bytes == 3 * (
        G.num_layers * G.block_bytes_per_layer)
    control.complete_load("c")
    # The engine holds all 8: no remote run is left, and the local part loads nothing.
    task, _ = load(control, "d", hit, slots, 8, far)
    assert task.remote == () and task.num_blocks <= 8 and task.first_block == 8
    h.close()
