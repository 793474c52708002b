"""The member's writes to the cluster index while Redis hangs (a paused redis-server,
resumed in teardown): what failed waits, in order, and reaches Redis once it answers;
a withdrawn segment is never published after its withdrawal, nothing Redis took is
sent again, and the wait is bounded."""

from __future__ import annotations

import time
from typing import Any

import pytest

from flatcake.cluster import ClusterIndex, RedisServer
from flatcake.cluster.writer import IndexWriter
from tests.cluster.helpers import keys, paused, seg


class Recorded:
    """A joined index that records each batch Redis took, in order."""

    def __init__(self, url: str) -> None:
        self.index = ClusterIndex(url, 1, cluster="w", timeout_s=0.3)
        self.index.join()
        self.took: list[tuple[str, list[int]]] = []

    def publish(self, segments: Any) -> bool:
        ok = self.index.publish(segments)
        if ok:
            self.took.append(("publish", [s[0] for s in segments]))
        return ok

    def remove(self, segments: Any) -> bool:
        ok = self.index.remove(segments)
        if ok:
            self.took.append(("remove", [s[0] for s in segments]))
        return ok


def until_sent(writer: IndexWriter, wait_s: float = 30.0) -> None:
    deadline = time.monotonic() + wait_s
    while len(writer) and time.monotonic() < deadline:
        writer.apply()
        time.sleep(0.05)
    assert len(writer) == 0, writer.waiting()


def test_what_redis_missed_reaches_it_in_order_once_it_answers(own_redis: RedisServer) -> None:
    member = Recorded(own_redis.url)
    reader = ClusterIndex(own_redis.url, 2, cluster="w")
    reader.join()
    ks = {sid: keys(3, f"seg{sid}") for sid in range(1, 6)}
    writer = IndexWriter(member, retry_s=(0.1, 0.2))
    writer.put("publish", [seg(1, 1, ks[1])])
    assert writer.apply() and [h.segment_id for h in reader.lookup(ks[1])] == [1, 1, 1]

    with paused(own_redis.pid):
        writer.put("publish", [seg(1, 2, ks[2]), seg(1, 3, ks[3])])
        writer.put("remove", [(1, ks[1])])
        writer.put("publish", [seg(1, 4, ks[4])])
        assert writer.apply()  # Redis hangs: the publish times out and everything waits
        assert writer.failures == 1 and writer.published == 1
        writer.put("remove", [(3, ks[3])])  # withdrawn while waiting: never published
        writer.put("publish", [seg(1, 5, ks[5])])
        writer.put("remove", [(5, ks[5])])
        assert writer.waiting() == [("publish", 2), ("remove", 1), ("publish", 4),
                                    ("remove", 3), ("remove", 5)]
    until_sent(writer)
    # In order, each batch once; 3 and 5 were withdrawn before Redis took them.
    assert member.took == [("publish", [1]), ("publish", [2]), ("remove", [1]),
                           ("publish", [4]), ("remove", [3, 5])]
    assert (writer.published, writer.removed, writer.dropped) == (3, 3, 0)
    for sid, found in ((1, 0), (2, 3), (3, 0), (4, 3), (5, 0)):
        assert len(reader.lookup(ks[sid])) == found, sid
    assert not writer.apply()  # nothing left to send again
    assert len(member.took) == 5


def test_the_wait_is_bounded_the_oldest_publish_dropped_first(own_redis: RedisServer) -> None:
    member = Recorded(own_redis.url)
    reader = ClusterIndex(own_redis.url, 2, cluster="w")
    reader.join()
    ks = {sid: keys(2, f"b{sid}") for sid in range(1, 5)}
    writer = IndexWriter(member, limit=2, retry_s=(0.1, 0.2))
    writer.put("publish", [seg(1, 1, ks[1])])
    writer.apply()
    with paused(own_redis.pid):
        writer.put("publish", [seg(1, 2, ks[2])])
        writer.apply()
        writer.put("remove", [(1, ks[1])])
        writer.put("publish", [seg(1, 3, ks[3])])
        writer.put("publish", [seg(1, 4, ks[4])])
        assert writer.dropped == 2 and writer.waiting() == [("remove", 1), ("publish", 4)]
    until_sent(writer)
    assert member.took[1:] == [("remove", [1]), ("publish", [4])]
    # 3 never reached Redis; 2's timed-out publish may have (the paused server read it
    # when resumed), which is no harm: its segment is still held.
    assert [len(reader.lookup(ks[s])) for s in (1, 3, 4)] == [0, 0, 2]


@pytest.mark.parametrize("bad", [{"limit": 0}, {"retry_s": (0.0, 1.0)},
                                 {"retry_s": (2.0, 1.0)}])
def test_bad_settings_are_refused_by_name(bad: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        IndexWriter(object(), **bad)  # type: ignore[arg-type]
