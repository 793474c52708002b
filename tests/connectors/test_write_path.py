"""The connector's write path without vLLM: a turn's prompt is written after the step
that computed it (not when the request ends), the request is released only once it
ended *and* its store is done, writes drain at close and at exit, a full writer queue
drops a store instead of stalling the engine, a preempted request's store finishes
before its blocks are reused, and the scheduler half reports block events."""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from flatcake.connectors.scheduler_side import RequestView
from flatcake.control.address import Medium
from flatcake.plan.tasks import StepPlan
from tests.connectors.sides_harness import G, Harness, end, view


def test_prompt_is_stored_before_the_request_ends(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    prompt = list(range(100, 113))  # 3 full blocks + 1 token
    v = view("a", prompt, session="s")
    h.sched.num_matched_tokens(v, 0)
    plan = h.sched.prompt_computed(v, [5, 6, 7, 8])
    assert plan is not None and plan.segment.num_blocks == 3
    assert h.sched.prompt_computed(v, [5, 6, 7, 8]) is None  # once per request
    # The step that computed the prompt writes it; the request is still decoding.
    step_plan, sending, _, _ = h.step()
    assert len(step_plan.stores) == 1 and sending == set()
    assert h.sched.num_pending_stores() == 0
    assert h.sched.control.lookup(v.keys).num_blocks == 3
    events = h.sched.take_events()
    assert [(e.stored, e.keys, e.medium) for e in events] == [(True, v.keys[:3], Medium.SSD)]
    # It ends later: its blocks are released at the next step, with nothing to wait for.
    delay, params = end(h, RequestView("a", v.keys, 20, 13, 7, 20, "s"))
    assert delay and params["flatcake"]["stored_blocks"] == 3
    _, sending, _, _ = h.step()
    assert sending == {"a"}
    # A request that stored nothing is released at once.
    v2 = view("b", list(range(100, 103)))
    h.sched.num_matched_tokens(v2, 0)
    assert h.sched.prompt_computed(v2, [9]) is None
    assert h.sched.request_finished(v2)[0] is False
    h.close()


def test_close_drains_pending_writes_and_a_fresh_process_finds_them(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    prompt = list(range(100, 117))  # 4 full blocks + 1
    v = view("a", prompt, session="s")
    h.sched.num_matched_tokens(v, 0)
    h.sched.prompt_computed(v, [1, 2, 3, 4, 5])
    step_plan = h.sched.build_step()
    h.worker.start_step(step_plan)
    h.worker.end_step()  # queued; the engine stops before reporting anything
    want = [h.block(layer, 2) for layer in range(G.num_layers)]
    h.close()
    h2 = Harness(tmp_path, seed=1)
    assert h2.sched.recovered_segments == 1
    assert h2.sched.num_matched_tokens(view("b", [*prompt, 7, 8, 9]), 0) == (16, True)
    h2.sched.after_alloc("b", [20, 21, 22, 23, 24], 16)
    _, _, recving, invalid = h2.step()
    assert recving == {"b"} and not invalid
    assert [h2.block(layer, 21) for layer in range(G.num_layers)] == want
    h2.close()


def test_a_store_that_cannot_finish_is_dropped_never_published(tmp_path: Path) -> None:
    from flatcake.connectors.worker_side import WorkerSide

    h = Harness(tmp_path)
    h.worker.close()
    gate = threading.Event()
    worker = WorkerSide(G, h.s, tmp_path, max_pending_stores=1, drain_timeout_s=0.2)
    worker.register(h.kv)
    h.worker = worker
    real_run = worker._writer_thread._run
    started = threading.Event()
    worker._writer_thread._run = lambda task: (started.set(), gate.wait(), real_run(task))[2]
    views = [view(r, list(range(base, base + 9)), session=r)
             for r, base in (("a", 100), ("b", 200), ("c", 300))]
    for i, v in enumerate(views):
        h.sched.num_matched_tokens(v, 0)
        h.sched.prompt_computed(v, [10 + 2 * i, 11 + 2 * i])
        worker.start_step(h.sched.build_step())
        worker.end_step()
        started.wait(10)  # a runs (blocked), then b waits in the queue, c finds it full
    _, _, _, report = worker.poll()
    h.sched.on_report(report)
    assert [(d.request_id, d.ok) for d in report.stores] == [("c", False)]
    assert h.sched.totals()["stores_failed"] == 1
    worker.close()  # drain times out: b is dropped, a is still running
    _, _, _, report = worker.poll()
    h.sched.on_report(report)
    assert [(d.request_id, d.ok) for d in report.stores] == [("b", False)]
    assert h.sched.control.lookup(views[1].keys).num_blocks == 0
    assert h.sched.num_pending_stores() == 1  # a: never reported, never published
    assert h.sched.control.lookup(views[0].keys).num_blocks == 0
    gate.set()


def test_preempted_request_store_finishes_before_its_blocks_are_reused(
        tmp_path: Path) -> None:
    h = Harness(tmp_path)
    gate = threading.Event()
    real_run = h.worker._writer_thread._run
    h.worker._writer_thread._run = lambda task: (gate.wait(), real_run(task))[1]
    v = view("a", list(range(100, 109)), session="s")
    h.sched.num_matched_tokens(v, 0)
    h.sched.prompt_computed(v, [3, 4])
    h.worker.start_step(h.sched.build_step())
    h.worker.end_step()
    _, _, _, report = h.worker.poll()
    assert report.stores == ()  # the write is held up
    plan = h.sched.build_step(preempted=["a", "other"])
    assert plan.preempted == ("a",)
    threading.Timer(0.2, gate.set).start()
    h.worker.start_step(plan)  # returns only once a's write is done
    _, _, _, report = h.worker.poll()
    assert [(d.request_id, d.ok) for d in report.stores] == [("a", True)]
    assert StepPlan(preempted=("a",)).is_empty() is False
    h.close()


def test_dropped_blocks_are_reported_removed(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    first = view("a", list(range(100, 109)), session="a")
    h.sched.num_matched_tokens(first, 0)
    h.sched.prompt_computed(first, [1, 2])
    h.step()
    assert [e.stored for e in h.sched.take_events()] == [True]
    h.sched._apply([h.sched.control.drop_session("a")])
    events = h.sched.take_events()
    assert [(e.stored, e.keys, e.medium) for e in events] == [
        (False, first.keys[:2], Medium.SSD)]
    assert h.sched.take_events() == []
    h.close()


EXIT_SCRIPT = """
import sys
from pathlib import Path
sys.path[:0] = [sys.argv[2], sys.argv[3]]
from tests.connectors.sides_harness import Harness, view

import time
h = Harness(Path(sys.argv[1]))
run = h.worker._writer_thread._run
h.worker._writer_thread._run = lambda task: (time.sleep(1.0), run(task))[1]  # a slow disk
v = view("a", list(range(100, 117)), session="s")
h.sched.num_matched_tokens(v, 0)
h.sched.prompt_computed(v, [1, 2, 3, 4, 5])
h.worker.start_step(h.sched.build_step())
h.worker.end_step()
# The process ends here: no close, no report; the exit hook drains the write.
"""


def test_a_process_that_exits_without_closing_still_writes_its_turn(tmp_path: Path) -> None:
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(tmp_path), str(repo),
                           str(repo / "src")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    h = Harness(tmp_path)
    assert h.sched.recovered_segments == 1
    assert h.sched.num_matched_tokens(view("b", [*range(100, 117), 5, 6]), 0) == (16, True)
    h.close()


def test_a_prefix_held_by_a_waiting_request_counts_as_shared(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    system = list(range(1, 9))  # 2 blocks
    first, second = view("a", [*system, 50, 51]), view("b", [*system, 60, 61])
    h.sched.new_request(first)
    h.sched.new_request(second)  # added to the engine, not scheduled yet
    h.sched.num_matched_tokens(first, 0)
    plan = h.sched.prompt_computed(first, [1, 2, 3])
    assert plan is not None and plan.placement.rule.value == "shared_prefix"
    assert plan.medium == Medium.MEMORY
    # b's blocks are being written by a: b waits for them instead of writing them again.
    assert h.sched.num_matched_tokens(second, 0) == (None, False)
    h.step()
    assert h.sched.num_matched_tokens(second, 0) == (8, False)
    assert h.sched.prompt_computed(second, [4, 5, 6]) is None
    assert h.sched.totals()["prompt_tokens"] == 20
    h.close()


STOP_SCRIPT = """
import sys, time
from pathlib import Path
sys.path[:0] = [sys.argv[2], sys.argv[3]]
from flatcake.connectors.worker_side import WorkerSide
from tests.connectors.sides_harness import G, Harness, view

h = Harness(Path(sys.argv[1]))
h.worker.close()
# A worker of vLLM's multiprocessing executor, which has 2 s to leave once told to stop.
h.worker = WorkerSide(G, h.s, Path(sys.argv[1]),
                      drain_timeout_s=h.s.engine.drain_within(2.0))
h.worker.register(h.kv)
a = view("a", list(range(100, 117)), session="a")
h.sched.num_matched_tokens(a, 0)
h.sched.prompt_computed(a, [1, 2, 3, 4, 5])
h.step()  # a's store reported durable: acknowledged
assert h.sched.control.lookup(a.keys).num_blocks == 4
run = h.worker._writer_thread._run
h.worker._writer_thread._run = lambda task: (time.sleep(60), run(task))[1]  # a stuck disk
for i, rid in enumerate(("b", "c")):  # b's write starts and hangs, c's waits behind it
    v = view(rid, list(range(200 + 100 * i, 217 + 100 * i)), session=rid)
    h.sched.num_matched_tokens(v, 0)
    h.sched.prompt_computed(v, [10 + 5 * i, 11 + 5 * i, 12 + 5 * i, 13 + 5 * i])
    h.worker.start_step(h.sched.build_step())
    h.worker.end_step()
started = time.monotonic()
h.worker.close()  # vLLM's worker shutdown
print(f"{time.monotonic() - started:.3f}", flush=True)
"""


def test_a_stopping_worker_leaves_within_its_bound_and_keeps_what_it_acknowledged(
        tmp_path: Path) -> None:
    """A worker told to stop while a write hangs drains for at most half of its exit
    grace, leaves (its writer does not hold the process), and the next start finds the
    acknowledged turn byte for byte, nothing of the unfinished ones, and a clean root."""
    import subprocess
    import sys

    from flatcake.config import EngineConfig
    from flatcake.store import fsck_root
    from tests.connectors.sides_harness import random_kv

    assert EngineConfig().drain_within(5.0) == 2.5  # vLLM's default grace: 5 s
    assert EngineConfig().drain_within(None) == 60.0  # in the engine's own process
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", STOP_SCRIPT, str(tmp_path), str(repo),
                           str(repo / "src")], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout.split()[-1]) < 1.0 + 0.4  # the drain bound, and a moment
    assert fsck_root(tmp_path).ok
    h = Harness(tmp_path, seed=1)
    assert h.sched.recovered_segments == 1
    a = view("a2", [*range(100, 117), 7, 8], session="a")
    assert h.sched.num_matched_tokens(a, 0) == (16, True)
    for rid, base in (("b2", 200), ("c2", 300)):
        assert h.sched.num_matched_tokens(view(rid, list(range(base, base + 19))),
                                          0) == (0, False)
    h.sched.after_alloc("a2", [20, 21, 22, 23, 24], 16)
    _, _, recving, invalid = h.step()
    assert recving == {"a2"} and not invalid
    want = random_kv(0)
    assert [h.block(layer, 20 + i) for layer in range(G.num_layers) for i in range(4)] == [
        want[layer][1 + i].contiguous().view(torch.uint8).numpy().tobytes()
        for layer in range(G.num_layers) for i in range(4)]
    h.close()
    assert fsck_root(tmp_path).clean
