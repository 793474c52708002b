"""A node service's cluster lookups while Redis hangs (a paused redis-server, resumed in
teardown): the lookup runs on the member's own thread, the service's loop waits for it
at most its bound and not at all while Redis still owes an earlier answer, so a local
hit is served as a local hit; once Redis answers, remote hits come back. After a
failure no lookup is waited for until Redis answers one again."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from flatcake.cluster import ClusterIndex, RedisServer
from flatcake.connectors.cluster_side import ClusterLookup
from flatcake.plan.requests import load
from flatcake.service.cluster import BoundedLookup, _MemberIndex
from tests.cluster.helpers import keys, paused, seg
from tests.connectors.sides_harness import G, Harness, finish, settings, tokens, view


class Counted:
    """A real index's lookup, counting the calls begun and answered."""

    def __init__(self, index: ClusterIndex) -> None:
        self.index, self.begun, self.answered = index, 0, 0
        self.lock = threading.Lock()

    def __call__(self, ks: Sequence[bytes]) -> list:
        with self.lock:
            self.begun += 1
        try:
            return self.index.lookup(ks, prefix=True)
        finally:
            with self.lock:
                self.answered += 1


def test_a_local_hit_is_served_while_redis_hangs(own_redis: RedisServer,
                                                 tmp_path: Path) -> None:
    h = Harness(tmp_path)
    asker = ClusterIndex(own_redis.url, 2, cluster="m", timeout_s=2.0)
    asker.join()
    counted = Counted(asker)
    bounded = BoundedLookup(counted, lambda: asker.failures, wait_s=0.2)
    try:
        turn0 = list(range(100, 113))  # 3 blocks stored here
        finish(h, "a", turn0, [5, 6, 7, 8], out=3, session="s")
        h.step()
        look = ClusterLookup(G, settings(), index=_MemberIndex(bounded))
        control = h.sched.control
        v = view("b", tokens(turn0, 20, 200))  # 8 blocks: 3 here
        hit = control.lookup(v.keys)
        assert hit.num_blocks == 3
        with paused(own_redis.pid):
            far = look.runs("b", v.keys, hit.num_blocks)
            # The scheduler half was answered while Redis still owed the lookup.
            assert far == () and (counted.begun, counted.answered) == (1, 0) and bounded.owed
            assert look.stats["cluster_lookup_failures"] == 1
            task, _ = load(control, "b", hit, list(range(20, 30)), 0, far)
            assert (task.first_block, task.num_blocks, task.remote) == (0, 3, ())
            control.complete_load("b")
            # Asked again while the answer is still owed (the half's back-off aside):
            # a miss at once, nothing queued behind the hanging call.
            assert bounded.lookup(v.keys[3:]) == [] and counted.begun == 1
        # Redis answers again: node 1's blocks are found past the local hit.
        owner = ClusterIndex(own_redis.url, 1, cluster="m")
        owner.join()
        assert owner.publish([seg(1, 9, list(v.keys[3:8]))])
        deadline = time.monotonic() + 10
        while bounded.owed and time.monotonic() < deadline:  # the owed answer
            time.sleep(0.02)
        bounded.wait_s = 5.0
        hits = bounded.lookup(v.keys[3:8])
        assert [x.segment_id for x in hits] == [9] * 5 and counted.begun == 2
    finally:
        bounded.close()
        h.close()


def test_a_lookup_that_raises_is_a_miss_and_a_failure() -> None:
    def broken(ks: Sequence[bytes]) -> list:
        raise ConnectionError("gone")

    bounded = BoundedLookup(broken, lambda: 0, wait_s=5.0)
    try:
        assert bounded.lookup(keys(2)) == [] and bounded.failures == 1
    finally:
        bounded.close()


def test_after_a_failure_no_lookup_waits_until_redis_answers_again() -> None:
    """A failed lookup puts Redis in back-off: the next ask is a miss at once (it only
    probes Redis; without this it waited ``wait_s`` for the hanging call), and once
    the probe is answered lookups are waited for again."""
    gate = threading.Event()
    calls: list[int] = []
    hit = object()

    def flaky(ks: Sequence[bytes]) -> list:
        calls.append(len(ks))
        if len(calls) == 1:
            raise ConnectionError("gone")
        assert gate.wait(30)  # Redis hangs until the test lets it answer
        return [hit]

    bounded = BoundedLookup(flaky, lambda: 0, wait_s=30.0)
    try:
        assert bounded.lookup(keys(2)) == [] and bounded.failures == 1
        got: list[Sequence[object]] = []
        asker = threading.Thread(target=lambda: got.append(bounded.lookup(keys(2))))
        asker.start()
        asker.join(10)
        # Answered at once: the probe is on the lookup thread, where it hangs.
        assert not asker.is_alive() and got == [[]] and bounded.owed
        assert bounded.failures == 2
        deadline = time.monotonic() + 10
        while len(calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(calls) == 2
        gate.set()
        while bounded.owed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bounded.lookup(keys(2)) == [hit] and len(calls) == 3
        assert bounded.failures == 2
    finally:
        gate.set()
        bounded.close()


def test_the_wait_must_be_positive() -> None:
    with pytest.raises(ValueError, match="wait_s must be positive"):
        BoundedLookup(lambda ks: [], lambda: 0, wait_s=0)
