"""Fencing in the books (``ControlPlane.fence_store``, ``service.fences``): a fenced write
is never published, nothing waits for its keys, and its range is given to no other store
until its writer's processes are gone or every worker reported it ended."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

from flatcake.plan.tasks import StoreDone
from flatcake.service.fences import descendants, fence, free_fenced, reported
from tests.control.helpers import first_turn, make, skeys


def until(done: Callable[[], object], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def prepared(cp, session: str, n: int = 4):  # type: ignore[no-untyped-def]
    """A memory-bound turn of ``session`` in flight (after a short reply)."""
    first_turn(cp, session, 2)
    plan = cp.prepare_store(session, skeys(session, 2 + n), turn_index=1,
                            context_tokens=4 * (2 + n), prev_reply_tokens=50)
    assert plan is not None and plan.medium.name == "MEMORY"
    return plan


def test_a_fenced_write_is_never_published_nor_waited_for_and_holds_its_range() -> None:
    cp, _ = make()
    plan = prepared(cp, "paused")
    keys = skeys("paused", 6)
    assert cp.store_in_flight(keys[2])
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        fenced = fence(cp, "engine e0", child.pid, None, [plan], reports=2)
        assert fenced is not None
        assert not cp.store_in_flight(keys[2])  # nothing waits for it
        used = cp.stats().memory_used_bytes
        # Another store of the same keys is planned, in another range.
        other = cp.prepare_store("again", keys, turn_index=1, context_tokens=24,
                                 prev_reply_tokens=50)
        assert other is not None and other.medium.name == "MEMORY"
        assert other.segment.offset >= plan.segment.offset + plan.segment.total_bytes or \
            other.segment.offset + other.segment.total_bytes <= plan.segment.offset
        cp.complete_store(other, True)
        # Its writer reports it durable: it is never published; one worker of two.
        seg_id = plan.segment.segment_id
        done = StoreDone("r", seg_id, True)
        assert reported([fenced], cp, child.pid + 1, (done,)) == (done,)  # not its pid
        fences = [fenced]
        assert reported(fences, cp, child.pid, (done,)) == ()
        assert fences and cp.stats().stores_in_flight == 1
        assert cp.stats().memory_used_bytes == used + other.segment.total_bytes
        assert reported(fences, cp, child.pid, (done,)) == ()  # the second worker
        assert fences == [] and cp.stats().stores_in_flight == 0
        assert cp.stats().memory_used_bytes == used + other.segment.total_bytes - \
            plan.segment.total_bytes
        assert [s.session_id for s in cp.segments() if s.segment_id == seg_id] == []
        cp.check_integrity()
    finally:
        child.kill()
        child.wait()


def test_a_fenced_write_is_freed_once_its_processes_are_gone() -> None:
    cp, _ = make()
    plan = prepared(cp, "paused")
    # A writer with a worker process of its own.
    writer = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys; subprocess.Popen([sys.executable, "
                               "'-c', 'import time; time.sleep(60)']).wait()"])
    try:
        until(lambda: descendants(writer.pid))
        (worker,) = descendants(writer.pid)
        fences = [fence(cp, "store s0", writer.pid, None, [plan])]
        assert fences[0] is not None and len(fences[0].processes) == 2
        os.kill(writer.pid, 9)
        writer.wait()
        assert free_fenced(fences, cp) == fences  # its worker may still write
        assert cp.stats().stores_in_flight == 1
        os.kill(worker[0], 9)
        until(lambda: free_fenced(fences, cp) == [])
        assert cp.stats().stores_in_flight == 0
        cp.check_integrity()
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()


def test_a_write_of_a_process_already_gone_is_rolled_back_at_once() -> None:
    cp, _ = make()
    plan = prepared(cp, "gone")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert fence(cp, "engine e0", child.pid, None, [plan], reports=1) is None
    assert cp.stats().stores_in_flight == 0
    # The calling process (a service its client started) is never one of the writer's.
    assert os.getpid() not in [p for p, _ in descendants(os.getppid())]
