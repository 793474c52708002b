"""The connector's two halves driven step by step without vLLM: the scheduler half plans
on a real control plane, the worker half moves real bytes between session files, the
host arena and a paged KV made of torch tensors. Each test is a scripted scenario."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

import flatcake
from flatcake.clock import ManualClock
from flatcake.connectors.scheduler_side import RequestView
from tests.connectors.sides_harness import (
    G4K,
    Harness,
    end,
    finish,
    settings,
    ssd_hit_admitted,
    tokens,
    view,
)


@pytest.mark.parametrize("aligned", [False, True])
def test_first_turn_goes_to_ssd_and_next_turn_restores_its_bytes(tmp_path: Path,
                                                                 aligned: bool) -> None:
    h = Harness(tmp_path, g=G4K) if aligned else Harness(tmp_path)
    turn0 = list(range(100, 113))  # 3 full blocks + 1 token
    # Turn 0 finishes; FIRST_TURN places it on SSD; blocks stay held until written.
    p = finish(h, "a", turn0, [5, 6, 7, 8], out=3, session="s")
    assert p["placement"] == "ssd:first_turn" and p["delay"] and p["stored_blocks"] == 3
    plan, sending, _, _ = h.step()
    assert len(plan.stores) == 1 and sending == {"a"}
    want = {(layer, j): h.block(layer, s) for layer in range(3) for j, s in enumerate([5, 6, 7])}
    # Turn 1 extends it: the 3 blocks hit on SSD -> async load.
    turn1 = tokens(turn0, 8, 200)
    v = view("b", turn1, session="s")
    assert h.sched.num_matched_tokens(v, 0) == (12, True)
    h.sched.after_alloc("b", [20, 21, 22, 23, 24], 12)
    plan, _, recving, invalid = h.step()
    assert [t.request_id for t in plan.loads] == ["b"] and not plan.loads[0].sync
    assert recving == {"b"} and invalid == set()
    for (layer, j), raw in want.items():
        assert h.block(layer, 20 + j) == raw
    _, params = end(h, RequestView("b", v.keys, len(turn1), len(turn1), 0, 12, "s"))
    assert params["flatcake"]["loaded_tokens_ssd"] == 12
    assert params["flatcake"]["turn_index"] == 1
    totals = h.sched.totals()
    assert totals["loaded_tokens_ssd"] == 12 and totals["restores_started"] == 1
    # Through the staging window (counted), 4 KiB blocks too: the load is fenced, given
    # up at its deadline, so it never reads straight into the slots.
    assert totals["loads_staged"] == 1
    h.close()


def test_corrupt_segment_is_recomputed_and_the_session_cut_before_it(tmp_path: Path) -> None:
    from flatcake.cio.filescan import scan_session_file

    h = Harness(tmp_path)
    turn0 = list(range(100, 117))  # 4 full blocks + 1
    v0 = view("a", turn0, session="s")
    h.sched.num_matched_tokens(v0, 0)
    # Turn 0 (SSD, first turn) ends with a 600-token reply (only its length matters
    # here), so turn 1 falls to the DEFAULT rule: SSD, appended to the same file.
    end(h, RequestView("a", v0.keys, 17, 17, 600, 17, "s"), [1, 2, 3, 4, 5])
    h.step()
    turn1 = [*tokens(turn0[:16], 16, 300), 7]
    v1 = view("b", turn1, session="s")
    assert h.sched.num_matched_tokens(v1, 0) == (16, True)
    h.sched.after_alloc("b", [10, 11, 12, 13, 14, 15, 16, 17, 18], 16)
    h.step()
    _, p1 = end(h, RequestView("b", v1.keys, 33, 33, 3, 33, "s"),
                [10, 11, 12, 13, 14, 15, 16, 17, 18])
    assert p1["flatcake"]["placement"] == "ssd:default"
    h.step()
    (path,) = (tmp_path / "sessions").iterdir()
    _, segments, _ = scan_session_file(path)
    assert [s.header.num_blocks for s in segments] == [4, 4]
    # The second segment rots on disk (one byte of its layer 1).
    second = segments[1]
    data = bytearray(path.read_bytes())
    pos = (second.file_offset + second.header.layout.data_offset
           + second.header.layout.layer_offset(1) - second.header.layout.header_bytes + 100)
    data[pos] ^= 0xFF
    path.write_bytes(bytes(data))
    # A request extending both turns: 8 blocks hit, the second segment's 4 fail.
    v2 = view("c", tokens(turn1[:32], 8, 900), session="s")
    assert h.sched.num_matched_tokens(v2, 0) == (32, True)
    slots = list(range(30, 41))
    h.sched.after_alloc("c", slots, 32)
    _, _, recving, invalid = h.step()
    assert recving == {"c"} and invalid == set(slots[4:8])
    _, params = end(h, RequestView("c", v2.keys, 40, 40, 0, 0, "s"))
    assert params["flatcake"]["load_error_blocks"] == 4
    assert params["flatcake"]["loaded_tokens_ssd"] == 16
    # The session is cut before the damaged segment: on disk too, and the first turn
    # is still served.
    h.step()
    assert h.sched.num_matched_tokens(view("d", tokens(turn1[:32], 8, 900)), 0) == (16, True)
    _, segments, damaged = scan_session_file(path)
    assert [s.header.num_blocks for s in segments] == [4] and not damaged
    assert path.stat().st_size == segments[0].end_offset
    assert h.sched.totals()["damaged_segments"] == 1
    h.close()


def test_short_reply_turn_lands_in_memory_and_shared_prefix_loads_synchronously(
        tmp_path: Path) -> None:
    h = Harness(tmp_path)
    system = list(range(1, 9))  # 2 blocks shared by every session
    # Two sessions are live at once with the same system prompt.
    va = view("a", tokens(system, 9, 100), session="A")
    vb = view("b", tokens(system, 9, 500), session="B")
    assert h.sched.num_matched_tokens(va, 0) == (0, False)
    assert h.sched.num_matched_tokens(vb, 0) == (0, False)
    # a finishes while b still runs: its first new block is held by 2 requests.
    _, pa = end(h, RequestView("a", va.keys, 17, 17, 0, 17, "A"), [1, 2, 3, 4, 5])
    assert pa["flatcake"]["placement"] == "memory:shared_prefix"
    h.step()
    want = {(layer, j): h.block(layer, s) for layer in range(3) for j, s in enumerate([1, 2])}
    # A third session shares only the system prompt: an all-memory hit, loaded
    # synchronously in the step that runs it, layer by layer.
    vc = view("c", tokens(system, 6, 900))
    assert h.sched.num_matched_tokens(vc, 0) == (8, False)
    h.sched.after_alloc("c", [30, 31, 32, 33], 8)
    assert h.sched.hit_sources("c") == (8, 0)
    plan, _, recving, invalid = h.step()
    assert plan.loads[0].sync and recving == set() and invalid == set()
    for (layer, j), raw in want.items():
        assert h.block(layer, 30 + j) == raw
    # c shared only an old part of session A: it starts a session of its own.
    _, pc = end(h, RequestView("c", vc.keys, 14, 14, 0, 8, None))
    assert pc["flatcake"]["session_id"].startswith("auto-")
    assert pc["flatcake"]["loaded_tokens_memory"] == 8
    # A short reply (chat) makes session A's next turn a memory segment.
    va2 = view("a2", tokens(tokens(system, 9, 100), 9, 1000), session="A")
    assert h.sched.num_matched_tokens(va2, 0)[0] == 16
    h.sched.after_alloc("a2", list(range(40, 47)), 16)
    _, p2 = end(h, RequestView("a2", va2.keys, 26, 26, 6, 26, "A"), list(range(40, 47)))
    h.step()
    assert p2["flatcake"]["turn_index"] == 1
    assert p2["flatcake"]["placement"] == "memory:short_reply"
    h.close()


def test_store_in_flight_defers_lookup_until_durable(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    turn0 = list(range(100, 113))
    finish(h, "a", turn0, [5, 6, 7, 8], out=1, session="s")
    v = view("b", tokens(turn0, 8, 200), session="s")
    # The write is planned but not executed yet: ask again later rather than miss.
    assert h.sched.num_matched_tokens(v, 0) == (None, False)
    h.step()
    assert h.sched.num_matched_tokens(v, 0) == (12, True)
    h.close()


def test_restart_recovers_ssd_segments_and_infers_the_session(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    turn0 = list(range(100, 113))
    finish(h, "a", turn0, [5, 6, 7, 8], out=1)  # no session id: auto session
    h.step()
    want = [h.block(layer, 6) for layer in range(3)]
    h.close()
    # A fresh process over the same directory: the index is rebuilt from headers.
    h2 = Harness(tmp_path, seed=1)
    assert h2.sched.recovered_segments == 1
    v = view("b", tokens(turn0, 8, 200))
    assert h2.sched.num_matched_tokens(v, 0) == (12, True)
    h2.sched.after_alloc("b", [50, 51, 52, 53, 54], 12)
    _, _, recving, invalid = h2.step()
    assert recving == {"b"} and not invalid
    assert [h2.block(layer, 51) for layer in range(3)] == want
    _, params = end(h2, RequestView("b", v.keys, 21, 21, 0, 21, None), [50, 51, 52, 53, 54])
    p = params["flatcake"]
    # Inferred from the longest stored prefix: the recovered session's turn 1.
    assert p["session_inferred"] and p["turn_index"] == 1 and p["session_id"].startswith("auto-")
    h2.close()


def test_fc_mas_bounds_restores_in_flight_and_counts_slot_waits(tmp_path: Path) -> None:
    clock = ManualClock()
    h = Harness(tmp_path, settings("scheduler.max_restores_in_flight=1"), clock=clock)
    big = list(range(100, 141))   # 10 blocks
    small = list(range(300, 309))  # 2 blocks
    finish(h, "a", big, list(range(0, 11)), out=1, session="big")
    finish(h, "b", small, [20, 21, 22], out=1, session="small")
    h.step()
    vb = view("b2", tokens(big, 4, 1000), session="big")
    vs = view("s2", tokens(small, 4, 2000), session="small")
    assert h.sched.num_matched_tokens(vb, 0) == (40, True)
    h.sched.after_alloc("b2", list(range(30, 41)), 40)
    assert h.sched.num_matched_tokens(vs, 0) == (8, True)
    h.sched.after_alloc("s2", [45, 46, 47], 8)
    clock.advance(1.0)
    # One staging window: the small restore goes first (priority = 1 + wait / bytes),
    # the big one waits for the slot and starts in the next step.
    plan, _, recving, _ = h.step()
    assert [t.request_id for t in plan.loads] == ["s2"] and recving == {"s2"}
    plan, _, recving, _ = h.step()
    assert [t.request_id for t in plan.loads] == ["b2"] and recving == {"b2"}
    assert h.released == ["s2", "b2"]  # out of FC-MAS's ready queue, in its order
    totals = h.sched.totals()
    assert totals["staging_slot_waits"] == 1 and totals["restores_started"] == 2
    h.close()


@pytest.mark.parametrize("extra, field", [
    ({"store": {"memory_capacity_bytes": -1}}, "store.memory_capacity_bytes"),
    ({"placement.short_reply_threshold_tokens": "lots"}, "placement.short_reply_threshold"),
    ({"stroe": {}}, "stroe"),
    ({"model": "llama-3.1-8b"}, "model"),
    ({"min_hit_blocks": 0}, "min_hit_blocks"),
    ({"ssd_loads_in_step": "maybe"}, "engine.ssd_loads_in_step"),
    ({"in_step_load_timeout_s": 0}, "in_step_load_timeout_s"),
    ({"store": 5}, "kv_connector_extra_config.store"),
    ({"store": {"node_id": 4096}}, "store.node_id"),
    ({"store.cluster_url": "localhost:6379"}, "store.cluster_url"),
])
def test_bad_extra_config_names_the_field(extra: dict, field: str) -> None:
    from flatcake.connectors.settings import parse_extra_config

    with pytest.raises(ValueError, match=field):
        parse_extra_config(extra, env={})


@pytest.mark.parametrize("field, bound", [("shutdown_drain_s", ">= 0"),
                                          ("in_step_load_timeout_s", "> 0")])
@pytest.mark.parametrize("value, why", [(-1, "must be {bound}"),
                                        (float("inf"), "must be a finite number"),
                                        (float("nan"), "must be a finite number"),
                                        (True, "must be a float"),
                                        ("five", "expected float")])
def test_bad_seconds_get_one_message_naming_setting_and_value(
        field: str, bound: str, value: object, why: str) -> None:
    from flatcake.connectors.settings import parse_extra_config

    with pytest.raises(ValueError) as err:
        parse_extra_config({field: value}, env={})
    assert str(err.value) == (f"kv_connector_extra_config: invalid config engine.{field}="
                              f"{value!r}: {why.format(bound=bound)}")


def test_extra_config_uses_the_store_names() -> None:
    from flatcake.connectors.settings import parse_extra_config

    s = parse_extra_config({"store": {"root": "/x", "memory_capacity_bytes": 4096,
                                      "node_id": 3},
                            "scheduler.single_queue": True, "tenant_salt": "t"}, env={})
    assert s.store.root == "/x" and s.store.memory_capacity_bytes == 4096
    assert s.store.node_id == 3
    assert s.scheduler.single_queue is True and s.engine.tenant_salt == "t"


def test_cluster_settings_are_taken_and_tensor_parallelism_is_refused_there(
        tmp_path: Path) -> None:
    from flatcake.connectors.scheduler_side import SchedulerSide
    from flatcake.connectors.settings import parse_extra_config
    from tests.connectors.sides_harness import G

    s = parse_extra_config({"store": {"node_id": 2, "cluster_url": "redis://127.0.0.1:1/0",
                                      "remote_timeout_s": 1.5}}, env={})
    assert s.store.cluster_url == "redis://127.0.0.1:1/0"
    assert s.store.node_id == 2 and s.store.remote_timeout_s == 1.5
    with pytest.raises(ValueError, match=r"tensor parallel size 2.*node id per rank"):
        SchedulerSide(G, s, tmp_path, world_size=2)


def test_step_plan_and_report_survive_pickling(tmp_path: Path) -> None:
    """Scheduler and worker may be different processes (vLLM pickles the metadata)."""
    import pickle

    h = Harness(tmp_path)
    turn0 = list(range(100, 113))
    finish(h, "a", turn0, [5, 6, 7, 8], out=1, session="s")
    plan = h.sched.build_step()
    copy = pickle.loads(pickle.dumps(plan))
    assert copy == plan and copy.stores[0].plan.segment.keys == plan.stores[0].plan.segment.keys
    h.worker.start_step(copy)
    h.worker.end_step()
    deadline = time.monotonic() + 30
    while h.worker.pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    sending, _, _, report = h.worker.poll({"a"})
    h.sched.on_report(pickle.loads(pickle.dumps(report)))
    assert sending == {"a"} and h.sched.num_pending_stores() == 0
    assert h.sched.control.lookup(view("x", turn0).keys).num_blocks == 3
    h.close()


def test_session_rules_and_prefix_refcount() -> None:
    from flatcake.control.signals import HitOwner, PrefixRefcount, SessionTracker

    t = SessionTracker()
    first = t.resolve("chat-1", 0, None)
    assert (first.session_id, first.turn_index, first.prev_reply_tokens) == ("chat-1", 0, None)
    t.finish_turn(first, reply_tokens=40, prompt_blocks=5)
    second = t.resolve("chat-1", 5, HitOwner("chat-1", True, 1))
    assert (second.turn_index, second.prev_reply_tokens, second.inferred) == (1, 40, False)
    # No session id: covering the session's latest prompt continues it ...
    cont = t.resolve(None, 6, HitOwner("chat-1", True, 1))
    assert (cont.session_id, cont.turn_index, cont.inferred) == ("chat-1", 1, True)
    # ... sharing only part of it (a system prompt) is a branch. A session the client
    # named takes none: the branch goes to its heir, a session of its own ...
    other = t.resolve(None, 2, HitOwner("chat-1", True, 1))
    assert other.session_id.startswith("auto-") and other.branch_point == 2
    # ... an inferred one takes it as a later turn, without the previous reply.
    auto = t.resolve(None, 0, None)
    t.finish_turn(auto, reply_tokens=40, prompt_blocks=5)
    other = t.resolve(None, 2, HitOwner(auto.session_id, True, 1))
    assert (other.session_id, other.turn_index, other.prev_reply_tokens,
            other.branch_point) == (auto.session_id, 1, None, 2)
    # A session only the store knows (after a restart) continues at its newest segment,
    # and a hit ending before it branches off it.
    assert t.resolve(None, 3, HitOwner("old", True, 4)).turn_index == 4
    branch = t.resolve(None, 3, HitOwner("old", False, 4))
    assert (branch.session_id, branch.turn_index, branch.branch_point) == ("old", 4, 3)
    assert SessionTracker(infer_sessions=False).resolve(
        None, 6, HitOwner("chat-1", True, 1)).session_id.startswith("auto-")
    with pytest.raises(ValueError, match="session_id"):
        t.resolve(7, 0, None)
    rc = PrefixRefcount()
    rc.add("r1", [b"a" * 32, b"b" * 32])
    rc.add("r2", [b"a" * 32])
    assert (rc.refcount(b"a" * 32), rc.refcount(b"b" * 32)) == (2, 1)
    rc.remove("r1")
    assert (rc.refcount(b"a" * 32), rc.refcount(b"b" * 32), len(rc)) == (1, 0, 1)


def test_scheduler_half_imports_no_torch_store_or_readers() -> None:
    # The scheduler process keeps the books only: the executor's modules (readers,
    # staging, the store) and torch stay out of it.
    code = ("import sys, flatcake.connectors.scheduler_side\n"
            "print(sorted(m for m in sys.modules if m in ('torch', 'vllm') or m.startswith("
            "('flatcake.store', 'flatcake.cio.readers', 'flatcake.cio.staging', "
            "'flatcake.cio.executor'))))")
    src = str(Path(flatcake.__file__).parents[1])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": src})
    assert out.stdout.strip() == "[]"


def test_a_restore_reads_only_the_segments_past_what_the_engine_holds(tmp_path: Path) -> None:
    """vLLM holds the session's first turn itself (its own prefix cache): the load of
    the rest reads only the second turn's segment from SSD, and delivers it whole."""
    h = Harness(tmp_path)
    turn0 = list(range(100, 117))  # 4 full blocks + 1
    v0 = view("a", turn0, session="s")
    h.sched.num_matched_tokens(v0, 0)
    end(h, RequestView("a", v0.keys, 17, 17, 600, 17, "s"), [1, 2, 3, 4, 5])
    h.step()
    turn1 = [*tokens(turn0[:16], 16, 300), 7]
    v1 = view("b", turn1, session="s")
    assert h.sched.num_matched_tokens(v1, 0) == (16, True)
    h.sched.after_alloc("b", [10, 11, 12, 13, 14, 15, 16, 17, 18], 16)
    h.step()
    end(h, RequestView("b", v1.keys, 33, 33, 3, 33, "s"), [10, 11, 12, 13, 14, 15, 16, 17, 18])
    h.step()
    want = {(layer, j): h.block(layer, 14 + j) for layer in range(3) for j in range(4)}
    # The engine holds blocks 0-3 (16 tokens): FlatCake loads 4-7, one segment's worth.
    v2 = view("c", tokens(turn1[:32], 8, 900), session="s")
    assert h.sched.num_matched_tokens(v2, 16) == (16, True)
    slots = list(range(30, 41))
    h.sched.after_alloc("c", slots, 16)
    plan, _, recving, invalid = h.step()
    (task,) = plan.loads
    per_segment = 3 * 4 * 512  # layers x blocks x bytes per block per layer
    assert task.first_block == 4 and task.num_blocks == 8
    assert task.read_plan.useful_bytes == per_segment  # not the first turn's segment
    assert recving == {"c"} and invalid == set()
    for (layer, j), raw in want.items():
        assert h.block(layer, 34 + j) == raw
    h.close()


def test_a_hit_whose_ssd_part_the_engine_holds_loads_synchronously(tmp_path: Path) -> None:
    """The SSD turn lies inside vLLM's own hit, the rest is in memory: FlatCake admits a
    sync load (the engine does not wait for a transfer) and the load is planned sync,
    from memory only, in the same step."""
    h = Harness(tmp_path)
    turn0 = list(range(100, 117))  # 4 full blocks + 1: SSD, first turn
    finish(h, "a", turn0, [1, 2, 3, 4, 5], out=3, session="s")
    h.step()
    turn1 = [*tokens(turn0[:16], 16, 300), 7]  # a short reply before it: memory
    v1 = view("b", turn1, session="s")
    assert h.sched.num_matched_tokens(v1, 0) == (16, True)
    h.sched.after_alloc("b", [10, 11, 12, 13, 14, 15, 16, 17, 18], 16)
    h.step()
    _, p1 = end(h, RequestView("b", v1.keys, 33, 33, 3, 33, "s"),
                [10, 11, 12, 13, 14, 15, 16, 17, 18])
    assert p1["flatcake"]["placement"] == "memory:short_reply"
    h.step()
    want = {(layer, j): h.block(layer, 14 + j) for layer in range(3) for j in range(4)}
    v2 = view("c", tokens(turn1[:32], 8, 900), session="s")
    assert h.sched.num_matched_tokens(v2, 16) == (16, False)  # blocks 0-3 are vLLM's
    slots = list(range(30, 41))
    h.sched.after_alloc("c", slots, 16)
    plan, _, recving, invalid = h.step()
    (task,) = plan.loads
    assert task.sync and task.read_plan.bytes_read == 0 and invalid == set()
    assert recving == set()  # nothing for the engine to wait for
    for (layer, j), raw in want.items():
        assert h.block(layer, 34 + j) == raw
    h.close()


def test_a_step_handed_over_twice_starts_its_load_once(tmp_path: Path) -> None:
    # On a CPU the vLLM connector starts a step before the forward pass and vLLM hands
    # the same plan over again after it: the SSD restore runs once, and its report
    # comes at the end of the step it started in.
    h = Harness(tmp_path)
    ssd_hit_admitted(h)
    submitted: list[Future] = []
    submit = h.worker.executor.submit_load

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        submitted.append(submit(*args, **kwargs))
        return submitted[-1]

    h.worker.executor.submit_load = counted  # type: ignore[method-assign]
    plan = h.sched.build_step()
    h.worker.start_step(plan)  # before the forward pass
    submitted[0].result(timeout=30)  # the forward pass outlasts the restore
    h.worker.start_step(plan)  # after it: nothing more
    h.worker.end_step()
    _, recving, invalid, report = h.worker.poll()
    assert len(submitted) == 1 and recving == {"b"} and invalid == set()
    assert [d.num_blocks_loaded for d in report.loads] == [3]
    h.close()
