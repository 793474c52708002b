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

from flatcake.link.wire import TensorRanks
from flatcake.plan.tasks import StepPlan
from flatcake.service.endpoint import ask_status
from tests.connectors.sides_harness import G, end, finish, tokens, view
from tests.service.helpers import Engine, Service, TensorEngine


def memory_turn(e: Engine | TensorEngine, rid: str, session: str, start: int
                ) -> tuple[list[int], StepPlan]:
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


def run_step(e: Engine | TensorEngine, plan: StepPlan, rank: int = 0) -> None:
    """Worker ``rank`` runs ``plan`` (its writes) and reports, as a step's end does."""
    worker = e.workers[rank] if isinstance(e, TensorEngine) else e.worker
    worker.start_step(plan)
    for layer in range(G.num_layers):
        worker.wait_for_layer(layer)
    worker.end_step()
    deadline = time.monotonic() + 30
    while True:
        _s, _r, _i, report = worker.poll(set())
        e.sched.on_report(report)
        e.sched.take_released(set())
        if not worker.pending() or time.monotonic() > deadline:
            break
        time.sleep(0.01)


def wait_released(svc: Service, e: Engine | TensorEngine, other: Engine | None = None
                  ) -> None:
    """Until the service released ``e`` (its lease ended); ``other`` keeps calling."""
    deadline = time.monotonic() + 30
    while e.sched.engine_id in ask_status(svc.sock, 5.0)["engines"]:
        assert time.monotonic() < deadline, svc.stderr()
        if other is not None:
            other.sched.take_stats()
        time.sleep(0.2)


@pytest.mark.timeout(180)
def test_a_worker_paused_past_its_engines_lease_writes_nothing_served(tmp_path: Path
                                                                      ) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "store.node_lease_s=1").start()
    a, b = Engine(svc.sock, seed=1, name="A"), Engine(svc.sock, seed=2, name="B")
    try:
        # 1. A's turn goes to the arena; its worker is handed the write, and A pauses.
        _, paused = memory_turn(a, "a", "sa", 100)
        (task,) = paused.stores
        wait_released(svc, a, b)  # B keeps calling: only A's lease ends
        # 2. B's turn of the same size takes a range of the arena and is reported.
        turn1_b, plan_b = memory_turn(b, "b", "sb", 1000)
        (task_b,) = plan_b.stores
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


@pytest.mark.timeout(180)
def test_a_write_one_rank_reported_before_the_lease_is_freed_by_the_others_report(
        tmp_path: Path) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "store.node_lease_s=1").start()
    e = TensorEngine(svc.sock, TensorRanks(2))
    try:
        _, plan = memory_turn(e, "a", "sa", 100)
        before = ask_status(svc.sock, 5.0)
        run_step(e, plan, rank=0)  # rank 0 wrote and reported; rank 1 is paused
        wait_released(svc, e)
        books = ask_status(svc.sock, 5.0)
        assert (books["stores_in_flight"], books["fenced_stores"]) == (1, 1), books
        run_step(e, plan, rank=1)  # rank 1 resumes: the write ended on every rank
        books = ask_status(svc.sock, 5.0)
        assert (books["stores_in_flight"], books["fenced_stores"]) == (0, 0), books
        assert books["memory_used_bytes"] == before["memory_used_bytes"] - \
            plan.stores[0].plan.segment.total_bytes
    finally:
        e.close()
        assert svc.stop() == 0, svc.stderr()


class _Unread:
    """An engine client's socket whose next answer arrives but is never read, as when
    the answer comes just past the client's timeout."""

    def __init__(self, sock: object) -> None:
        self.sock = sock

    def recv(self, deadline: float) -> bytes:
        self.sock.recv(time.monotonic() + 5.0)  # type: ignore[attr-defined]  # it arrives ...
        raise TimeoutError  # ... past the client's wait: never read

    def __getattr__(self, name: str) -> object:
        return getattr(self.sock, name)


@pytest.mark.timeout(180)
def test_a_step_whose_answer_was_never_read_holds_nothing(tmp_path: Path) -> None:
    # A's step hands its turn's store to its workers, but the answer is never read: no
    # worker has that store. A attaches anew; the old A is released at once, its store
    # rolled back. (On the old code the store stayed fenced, its range held, until A's
    # process exited: no worker would ever report it.)
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock").start()
    a = Engine(svc.sock, seed=1, name="A", overrides=("engine.node_reattach_s=0.01",))
    try:
        idle = ask_status(svc.sock, 5.0)
        turn0 = list(range(100, 113))
        v = view("a0", turn0, out=3, computed=len(turn0), session="sa")
        a.sched.num_matched_tokens(v, 0)
        end(a, v, [5, 6, 7, 8])
        client = a.sched.client  # type: ignore[attr-defined]
        real = client._socket()
        client._sock = _Unread(real)
        old = a.sched.engine_id
        plan = a.sched.build_step()  # the service ran it; its answer was dropped
        assert plan.stores == () and a.sched.engine_id == ""
        time.sleep(0.05)
        # A's next lookup attaches it anew, naming the step it gave up on.
        assert a.sched.num_matched_tokens(view("x", list(range(5000, 5013))), 0) == (0, False)
        books = ask_status(svc.sock, 5.0)
        assert old not in books["engines"] and a.sched.engine_id in books["engines"]
        assert (books["stores_in_flight"], books["fenced_stores"]) == (0, 0), books
        for used in ("memory_used_bytes", "ssd_used_bytes"):  # its range is free
            assert books[used] == idle[used], books
        # A's next turn is stored and restored as if the step had never been.
        assert finish(a, "a1", turn0, [5, 6, 7, 8], out=3, session="sa"
                      )["stored_blocks"] == 3
        a.step()
        v = view("a2", tokens(turn0, 8, 600), session="sa")
        assert a.sched.num_matched_tokens(v, 0)[0] == 12
    finally:
        a.close()
        assert svc.stop() == 0, svc.stderr()
