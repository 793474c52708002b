"""FC-MAS scheduler: scripted scenarios (a reader can follow the clock step by step) and
a stateful check of the queue books."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from flatcake.clock import ManualClock
from flatcake.config import GIB, SchedulerConfig
from flatcake.control import MasScheduler, RestoreRequest, priority


def req(rid: str, t: float, gib: float = 0.0) -> RestoreRequest:
    kv = int(gib * GIB)
    return RestoreRequest(rid, t, kv, kv > 0)


def sched(max_in_flight: int = 1, single: bool = False) -> tuple[MasScheduler, ManualClock]:
    clock = ManualClock()
    return MasScheduler(SchedulerConfig(max_in_flight, single), clock), clock


class TestPriority:
    def test_paper_example_3_vs_1_5(self) -> None:
        # A 1 GB and a 4 GB restore have both waited 2 s.
        assert priority(2.0, GIB) == pytest.approx(3.0)
        assert priority(2.0, 4 * GIB) == pytest.approx(1.5)

    def test_small_restore_goes_first(self) -> None:
        s, clock = sched()
        s.submit(req("big", 0.0, 4))
        s.submit(req("small", 0.0, 1))
        clock.set(2.0)
        assert s.priority(req("small", 0.0, 1)) == pytest.approx(3.0)
        assert [r.request_id for r in s.preparing_requests()] == ["small", "big"]
        assert [r.request_id for r in s.next_restores()] == ["small"]

    def test_aging_prevents_starvation(self) -> None:
        # A 10 GiB restore arrives at t=0. Every second a 1 GiB request shows up that has
        # already waited 1 s (priority 2); the single slot frees each second. The big
        # one's priority 1 + t/10 passes 2 at t = 10, so it starts then, not never.
        s, clock = sched()
        s.submit(req("big", 0.0, 10))
        started_at = None
        for t in range(1, 60):
            clock.set(float(t))
            s.submit(req(f"small{t}", t - 1.0, 1))
            (r,) = s.next_restores()
            if r.request_id == "big":
                started_at = t
                break
            s.restore_done(r.request_id)
        assert started_at is not None and 10 <= started_at <= 11

    def test_order_of_restores_that_all_run_now(self) -> None:
        # Loads in one step: the all-memory one first, then the SSD ones as
        # next_restores would start them (the small one first, the aged big one before
        # a fresh small one); one queue keeps them as given.
        reqs = [req("big", 0.0, 4), req("aged", -20.0, 8), req("mem", 0.0),
                req("small", 0.0, 1)]
        s, clock = sched()
        clock.set(2.0)
        assert [r.request_id for r in s.order(reqs)] == ["mem", "aged", "small", "big"]
        assert len(s) == 0  # nothing queued by it
        fifo, _ = sched(single=True)
        assert [r.request_id for r in fifo.order(reqs)] == ["big", "aged", "mem", "small"]

    def test_ties_by_arrival(self) -> None:
        s, _ = sched(max_in_flight=3)
        for rid, t in (("c", 3.0), ("a", 1.0), ("b", 2.0)):
            s.submit(req(rid, t, 1))
        # All same size and the clock is at 0 (no one has waited): arrival order.
        assert [r.request_id for r in s.next_restores()] == ["a", "b", "c"]


class TestTwoQueues:
    def test_memory_only_requests_run_at_once(self) -> None:
        s, _ = sched()
        s.submit(req("ssd", 0.0, 2))
        s.submit(req("mem", 1.0))
        assert s.pop_ready().request_id == "mem"  # type: ignore[union-attr]
        assert s.pop_ready() is None

    def test_restored_request_reenters_at_its_arrival_position(self) -> None:
        s, clock = sched()
        s.submit(req("A", 0.0, 2))  # needs SSD
        s.submit(req("B", 1.0))  # memory only
        clock.set(2.0)
        s.submit(req("C", 2.0))  # memory only
        assert [r.request_id for r in s.next_restores()] == ["A"]
        assert [r.request_id for r in s.ready_requests()] == ["B", "C"]
        clock.set(3.0)
        s.restore_done("A")
        # A arrived first, so it goes ahead of B and C, not to the tail.
        assert [r.request_id for r in s.ready_requests()] == ["A", "B", "C"]
        assert [s.pop_ready().request_id for _ in range(3)] == ["A", "B", "C"]  # type: ignore[union-attr]
        assert len(s) == 0

    def test_restores_wait_for_a_slot_never_cancelled(self) -> None:
        s, clock = sched(max_in_flight=2)
        for i in range(3):
            s.submit(req(f"r{i}", 0.0, 1))
        first = s.next_restores()
        assert len(first) == 2 and s.num_in_flight == 2
        assert s.next_restores() == []  # r2 waits; nothing is cancelled
        assert [r.request_id for r in s.in_flight()] == ["r0", "r1"]
        assert s.stats.num_slot_waits == 1
        clock.set(5.0)
        s.restore_done("r0")
        assert [r.request_id for r in s.next_restores()] == ["r2"]
        st_ = s.stats
        assert (st_.num_restores_started, st_.num_restores_done, st_.max_in_flight) == (3, 1, 2)
        assert st_.total_slot_wait_s == pytest.approx(5.0)  # only r2 waited, 5 s


class TestSingleQueue:
    def test_head_blocks_memory_requests_behind_it(self) -> None:
        s, clock = sched(single=True)
        s.submit(req("A", 0.0, 2))  # SSD
        s.submit(req("B", 1.0))  # memory only, but behind A
        assert s.pop_ready() is None and s.ready_requests() == []
        assert [r.request_id for r in s.next_restores()] == ["A"]
        assert s.pop_ready() is None  # A's restore is still running
        clock.set(4.0)
        s.restore_done("A")
        assert [r.request_id for r in s.ready_requests()] == ["A", "B"]
        assert s.pop_ready().request_id == "A"  # type: ignore[union-attr]
        assert s.pop_ready().request_id == "B"  # type: ignore[union-attr]

    def test_restores_start_in_fifo_order_not_by_priority(self) -> None:
        s, clock = sched(max_in_flight=1, single=True)
        s.submit(req("big", 0.0, 8))
        s.submit(req("small", 0.0, 1))
        clock.set(3.0)
        assert [r.request_id for r in s.next_restores()] == ["big"]

    def test_same_io_parallelism_as_two_queues(self) -> None:
        s, _ = sched(max_in_flight=2, single=True)
        for i in range(3):
            s.submit(req(f"r{i}", float(i), 1))
        assert [r.request_id for r in s.next_restores()] == ["r0", "r1"]
        s.restore_done("r1")  # finishes first, but r0 is the head
        assert s.pop_ready() is None
        s.check_integrity()


class TestErrors:
    def test_bad_requests_name_the_field(self) -> None:
        with pytest.raises(ValueError, match="kv_bytes"):
            RestoreRequest("x", 0.0, -1, False)
        with pytest.raises(ValueError, match="kv_bytes"):
            RestoreRequest("x", 0.0, 0, True)
        with pytest.raises(ValueError, match="arrival_time"):
            RestoreRequest("x", float("nan"), 1, True)
        with pytest.raises(ValueError, match="needs_ssd"):
            RestoreRequest("x", 0.0, 1, 1)  # type: ignore[arg-type]

    def test_duplicate_and_unknown_ids(self) -> None:
        s, _ = sched()
        s.submit(req("a", 0.0, 1))
        with pytest.raises(ValueError, match="'a'"):
            s.submit(req("a", 1.0))
        with pytest.raises(KeyError, match="'a'"):
            s.restore_done("a")  # queued but not started
        with pytest.raises(KeyError, match="'zz'"):
            s.restore_done("zz")

    def test_bad_config(self) -> None:
        with pytest.raises(ValueError, match="max_restores_in_flight"):
            SchedulerConfig(max_restores_in_flight=0)


class SchedulerMachine(RuleBasedStateMachine):
    """Random submits, restore starts/completions and pops in both modes: every request
    is popped exactly once, after its restore if it needed one; the in-flight bound
    holds; the queue books stay consistent."""

    @initialize(max_in_flight=st.integers(1, 3), single=st.booleans())
    def setup(self, max_in_flight: int, single: bool) -> None:
        self.clock = ManualClock()
        self.s = MasScheduler(SchedulerConfig(max_in_flight, single), self.clock)
        self.next_id = 0
        self.held: dict[str, RestoreRequest] = {}
        self.flying: list[str] = []
        self.restored: set[str] = set()
        self.popped: list[RestoreRequest] = []

    @rule(gib=st.sampled_from([0, 0, 1, 3]), dt=st.floats(0, 2))
    def submit(self, gib: int, dt: float) -> None:
        self.clock.advance(dt)
        r = req(f"q{self.next_id}", self.clock.now(), gib)
        self.next_id += 1
        self.s.submit(r)
        self.held[r.request_id] = r  # type: ignore[index]

    @rule(dt=st.floats(0, 2))
    def start(self, dt: float) -> None:
        self.clock.advance(dt)
        for r in self.s.next_restores():
            assert r.needs_ssd and r.request_id not in self.restored
            self.flying.append(r.request_id)  # type: ignore[arg-type]

    @precondition(lambda self: self.flying)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self.flying))
        self.flying.remove(rid)
        self.restored.add(rid)
        self.s.restore_done(rid)

    @rule()
    def pop(self) -> None:
        r = self.s.pop_ready()
        if r is None:
            return
        assert not r.needs_ssd or r.request_id in self.restored
        assert self.held.pop(r.request_id) is r  # type: ignore[arg-type]
        self.popped.append(r)
        if self.s.cfg.single_queue:
            # One FIFO: pops come out in submission order.
            assert [int(p.request_id[1:]) for p in self.popped] == sorted(  # type: ignore[index]
                int(p.request_id[1:]) for p in self.popped)  # type: ignore[index]

    @invariant()
    def books(self) -> None:
        self.s.check_integrity()
        assert len(self.s) == len(self.held)
        assert self.s.num_in_flight == len(self.flying) <= self.s.cfg.max_restores_in_flight


TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
