"""An engine's worker paused past its lease writes nothing anyone is served (issue 40,
through the connector's path): engine A's scheduler half planned a turn into the shared
arena and handed it to its worker, then A went silent (a SIGSTOPped container) and the
service abandoned it. Its store is fenced: never published, its range held, so the next
turn (engine B's) is given another range; A's worker then resumes and writes its range,
and B's turn is served byte for byte. Once A's worker reports the write ended, the range
is freed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flatcake.service.endpoint import ask_status
from tests.connectors.sides_harness import G, end, finish, tokens, view
from tests.service.helpers import Engine, Service

pytest.importorskip("zmq")


def memory_turn(e: Engine, rid: str, session: str, start: int) -> tuple[list[int], object]:
    """A session's first turn (SSD, stored and reported), then its second turn's
    prompt computed into slots 20-24 with a short reply before it (memory): returns the
    second turn's tokens and its step plan, its store handed to the worker."""
    turn0 = list(range(start, start + 13))  # 3 full blocks + 1 token
    assert finish(e, f"{rid}0", turn0, [5, 6, 7, 8], out=3, session=session
                  )["stored_blocks"] == 3
    e.step()
    turn1 = tokens(turn0, 8, start + 500)  # 5 full blocks
    v = view(f"{rid}1", turn1, out=3, computed=len(turn1), session=session)
    assert e.sched.num_matched_tokens(v, 0) == (12, True)
    _, params = end(e, v, [20, 21, 22, 23, 24])
    assert params["flatcake"]["placement"] == "memory:short_reply"
    plan = e.sched.build_step()
    assert [t.plan.medium.name for t in plan.stores] == ["MEMORY"]
    return turn1, plan


def run_step(e: Engine, plan: object) -> None:
    """The worker runs ``plan`` (its writes) and reports, as a step's end does."""
    e.worker.start_step(plan)  # type: ignore[arg-type]
    for layer in range(G.num_layers):
        e.worker.wait_for_layer(layer)
    e.worker.end_step()
    deadline = time.monotonic() + 30
    while e.worker.pending() and time.monotonic() < deadline:
        e._report(set())
        time.sleep(0.01)
    e._report(set())


@pytest.mark.timeout(180)
def test_a_worker_paused_past_its_engines_lease_writes_nothing_served(tmp_path: Path
                                                                      ) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "store.node_lease_s=1").start()
    a, b = Engine(svc.sock, seed=1, name="A"), Engine(svc.sock, seed=2, name="B")
    try:
        # 1. A's turn goes to the arena; its worker is handed the write, and A pauses.
        _, paused = memory_turn(a, "a", "sa", 100)
        (task,) = paused.stores  # type: ignore[attr-defined]
        held = ask_status(svc.sock, 5.0)["memory_used_bytes"]
        assert held >= task.plan.segment.total_bytes
        deadline = time.monotonic() + 30
        while a.sched.engine_id in ask_status(svc.sock, 5.0)["engines"]:
            assert time.monotonic() < deadline, svc.stderr()
            b.sched.take_stats()  # B keeps calling: only A's lease ends
            time.sleep(0.2)
        # 2. B's turn of the same size takes a range of the arena and is reported.
        turn1_b, plan_b = memory_turn(b, "b", "sb", 1000)
        (task_b,) = plan_b.stores  # type: ignore[attr-defined]
        mine, theirs = task_b.plan.segment, task.plan.segment
        run_step(b, plan_b)
        # (The turn's blocks: the first turn's from slots 5-7, its own from 23-24.)
        want = {(layer, j): b.block(layer, s) for layer in range(3)
                for j, s in enumerate([5, 6, 7, 23, 24])}
        # 3. A's worker resumes: it writes its range and reports the write.
        run_step(a, paused)
        # 4. B's next turn restores its turn byte for byte (none of A's bytes).
        turn2_b = tokens(turn1_b, 8, 3000)
        v = view("b2", turn2_b, session="sb")
        assert b.sched.num_matched_tokens(v, 0) == (20, True)
        b.sched.after_alloc("b2", list(range(40, 46)), 20)
        _, _, recving, invalid = b.step()
        assert recving == {"b2"} and invalid == set()
        wrong = [(layer, j) for (layer, j), raw in want.items()
                 if b.block(layer, 40 + j) != raw]
        assert wrong == [], (mine, theirs)
        # A's turn was never published; its range is free again once it reported.
        v = view("a2", tokens(tokens(list(range(100, 113)), 8, 600), 8, 700),
                 session="sa")
        assert a.sched.num_matched_tokens(v, 0) == (12, True)
        books = ask_status(svc.sock, 5.0)
        assert books["stores_in_flight"] == 0, books
        assert books["memory_used_bytes"] == mine.total_bytes, books
    finally:
        a.close()
        b.close()
        assert svc.stop() == 0, svc.stderr()
