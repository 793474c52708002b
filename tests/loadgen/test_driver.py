"""The driver with a scripted sender (no HTTP): turns in order inside a session, the
concurrency and request bounds kept, Poisson arrivals, the client's reusable tokens,
and a run that stops when its first requests all fail."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from flatcake.loadgen import Job, Pacing, Reply, Session, TokenSpace, Turn, Workload, run


def workload(sessions: int, turns: int, block_tokens: int = 4) -> Workload:
    """Each session's turn k sends blocks [s*100, ..., s*100 + k]: every turn extends
    the one before by one block."""
    def gen() -> Iterator[Session]:
        for s in range(sessions):
            yield Session(name=f"s{s}", turns=tuple(
                Turn(block_ids=np.arange(s * 100, s * 100 + k + 1, dtype=np.int64),
                     tail_tokens=1, tail_key=s * 100 + k, max_tokens=1)
                for k in range(turns)))
    return Workload("test", gen(), TokenSpace(1000), block_tokens,
                    num_requests=sessions * turns)


class Sender:
    """Replies after ``delay_s``; records sends and the most requests in flight."""

    def __init__(self, delay_s: float = 0.01, error: str | None = None) -> None:
        self.delay_s, self.error = delay_s, error
        self.lock = threading.Lock()
        self.in_flight = self.most = 0
        self.log: list[tuple[str, int, str]] = []  # (session, turn, "sent" / "done")

    def __call__(self, job: Job, prompt: list[int]) -> Reply:
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self.log.append((job.session_id, job.turn_index, "sent"))
        time.sleep(self.delay_s)
        with self.lock:
            self.in_flight -= 1
            self.log.append((job.session_id, job.turn_index, "done"))
        if self.error:
            return Reply(status=500, error=self.error)
        return Reply(status=200, ttft_s=self.delay_s, e2e_s=self.delay_s,
                     prompt_tokens=len(prompt), cached_tokens=0, completion_tokens=1)


def test_closed_loop_sends_each_turn_after_the_previous_reply() -> None:
    send = Sender()
    result = run(workload(5, 3), Pacing(concurrency=2, duration_s=30), send)
    assert len(result.records) == 15 and not result.interrupted and result.aborted is None
    assert send.most == 2
    for s in range(5):
        mine = [(t, what) for name, t, what in send.log if name == f"s{s}"]
        assert mine == [(0, "sent"), (0, "done"), (1, "sent"), (1, "done"),
                        (2, "sent"), (2, "done")]
    # Turn k reuses the k blocks turn k-1 sent; the first turn nothing.
    for r in result.records:
        assert r.reusable_tokens == 4 * r.turn and r.prompt_tokens_sent == 4 * (r.turn + 1) + 1
    assert sorted(r.index for r in result.records) == list(range(15))


def test_max_requests_bounds_the_run() -> None:
    result = run(workload(10, 3), Pacing(concurrency=3, max_requests=7, duration_s=None),
                 Sender())
    assert len(result.records) == 7


def test_open_loop_sends_poisson_arrivals_and_keeps_session_order() -> None:
    send = Sender(delay_s=0.02)
    start = time.perf_counter()
    result = run(workload(100, 2), Pacing(rate=200.0, concurrency=8, max_requests=40,
                                          duration_s=None, seed=1), send)
    took = time.perf_counter() - start
    assert len(result.records) == 40 and send.most <= 8
    assert 0.05 < took < 5.0  # 40 arrivals at 200/s: ~0.2 s
    dues = sorted(r.due_s for r in result.records)
    assert dues[-1] == pytest.approx(0.2, rel=0.6)
    for r in result.records:
        assert r.sent_s >= r.due_s - 1e-3  # never before its arrival
    for s in {r.session_id for r in result.records}:
        mine = [t for name, t, what in send.log if name == s and what == "sent"]
        assert mine == sorted(mine)


def test_duration_bounds_an_endless_run() -> None:
    def endless() -> Iterator[Session]:
        k = 0
        while True:
            yield Session(name="x", turns=(Turn(np.array([k]), 1, k, 1),))
            k += 1
    wl = Workload("endless", endless(), TokenSpace(1000), 4)
    start = time.perf_counter()
    result = run(wl, Pacing(concurrency=2, duration_s=0.3), Sender(delay_s=0.01))
    assert 0.25 < time.perf_counter() - start < 3.0 and len(result.records) > 5


def test_a_run_whose_first_requests_all_fail_stops_with_the_first_error() -> None:
    send = Sender(error="HTTP 400: Token id 40000 is out of vocabulary")
    result = run(workload(50, 2), Pacing(concurrency=1, duration_s=30), send)
    assert result.aborted == ("the first 3 requests failed: HTTP 400: Token id 40000 is "
                              "out of vocabulary")
    assert len(result.records) == 3


@pytest.mark.parametrize(("kw", "message"), [
    ({"rate": 0}, "--rate must be > 0"), ({"concurrency": 0}, "--concurrency must be > 0"),
    ({"duration_s": -1}, "--duration must be > 0"),
    ({"max_requests": 0}, "--max-requests must be > 0"),
])
def test_bad_pacing_is_refused(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Pacing(**kw)


def test_each_record_names_its_prompt_blocks_as_runs() -> None:
    result = run(workload(2, 3), Pacing(concurrency=1, duration_s=30), Sender(0.0))
    for r in result.records:
        s = int(r.session_id[1:])
        assert r.blocks == ((s * 100, s * 100 + r.turn + 1),)
        assert r.to_json()["blocks"] == [[s * 100, s * 100 + r.turn + 1]]


def test_id_runs_splits_where_ids_are_not_consecutive() -> None:
    from flatcake.loadgen.driver import id_runs

    assert id_runs(np.array([7, 8, 9, 3, 4, 12], dtype=np.int64)) == ((7, 10), (3, 5),
                                                                        (12, 13))
    assert id_runs(np.zeros(0, dtype=np.int64)) == ()
