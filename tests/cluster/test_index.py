"""The cluster index against a real Redis: publish after durable, remove on reclaim,
epochs and leases, batched lookups, and Redis failures as misses."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from flatcake.cluster import ClusterIndex, StaleNodeError
from flatcake.control.address import Medium
from tests.cluster.helpers import keys, seg


def index(url: str, cluster: str, node: int, **kw) -> ClusterIndex:
    idx = ClusterIndex(url, node, cluster=cluster, **kw)
    idx.join()
    return idx


def test_published_segment_is_found_by_another_node(redis_url: str, cluster: str) -> None:
    a, b = index(redis_url, cluster, 0), index(redis_url, cluster, 1)
    ks = keys(8)
    assert b.lookup(ks) == []
    assert a.publish([seg(0, 7, ks)])
    hits = b.lookup(ks)
    assert [h.key for h in hits] == ks
    assert {(h.node, h.segment_id) for h in hits} == {(0, 7)}
    assert [h.position for h in hits] == list(range(8))
    assert hits[3].record == {"segment_id": 7, "file_id": 7, "blocks": 8}
    assert hits[3].medium == Medium.SSD
    assert a.lookup(ks) == []  # a node's own entries are its local index's business


def test_lookup_is_batched_and_stops_at_the_first_miss(redis_url: str, cluster: str) -> None:
    a, b = index(redis_url, cluster, 0), index(redis_url, cluster, 1)
    ks = keys(500)
    a.publish([seg(0, 1, ks[:300]), seg(0, 2, ks[301:])])
    before = b.round_trips
    hits = b.lookup(ks)
    assert b.round_trips - before == 3  # keys; leases; segment records
    assert len(hits) == 300
    assert len(b.lookup(ks, prefix=False)) == 499
    # The local index first: keys it serves are not asked for.
    local = set(ks[:100])
    assert [h.key for h in b.lookup(ks, local=local.__contains__)] == ks[100:300]


def test_reclaim_removes_only_that_segments_entries(redis_url: str, cluster: str) -> None:
    a, b = index(redis_url, cluster, 0), index(redis_url, cluster, 1)
    ks = keys(6)
    a.publish([seg(0, 1, ks), seg(0, 2, ks[:3], base=1 << 20)])  # 2 re-publishes 3 keys
    assert a.remove([(1, ks)])
    hits = b.lookup(ks, prefix=False)
    assert [(h.key, h.segment_id) for h in hits] == [(k, 2) for k in ks[:3]]
    assert a.remove([(2, ks[:3])])
    assert b.lookup(ks) == []


def test_memory_copies_win_and_several_owners_coexist(redis_url: str, cluster: str) -> None:
    a, c, b = (index(redis_url, cluster, n) for n in (0, 2, 1))
    ks = keys(4)
    a.publish([seg(0, 1, ks, Medium.SSD)])
    c.publish([seg(2, 5, ks, Medium.MEMORY)])
    assert {(h.node, h.medium) for h in b.lookup(ks)} == {(2, Medium.MEMORY)}
    c.remove([(5, ks)])
    assert {(h.node, h.medium) for h in b.lookup(ks)} == {(0, Medium.SSD)}


def test_restart_ignores_old_entries_until_republished(redis_url: str, cluster: str) -> None:
    a, b = index(redis_url, cluster, 0), index(redis_url, cluster, 1)
    ks = keys(5)
    a.publish([seg(0, 1, ks)])
    a2 = index(redis_url, cluster, 0)  # the node restarts: a new life, a new epoch
    assert a2.epoch > a.epoch
    assert b.lookup(ks) == []  # recovery has not re-published yet
    with pytest.raises(StaleNodeError):
        a.renew()  # the old life cannot take the lease back
    assert a2.publish([seg(0, 1, ks)])  # recovery re-publishes what it kept
    assert [h.epoch for h in b.lookup(ks)] == [a2.epoch] * 5


def test_a_node_that_leaves_or_lets_its_lease_lapse_is_ignored(redis_url: str,
                                                                cluster: str) -> None:
    a, b = index(redis_url, cluster, 0), index(redis_url, cluster, 1)
    c = index(redis_url, cluster, 2, lease_ms=200)
    ks = keys(3)
    a.publish([seg(0, 1, ks)])
    a.leave()
    assert b.lookup(ks) == []
    c.publish([seg(2, 1, ks)])
    deadline = time.monotonic() + 10
    while b.lookup(ks) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b.lookup(ks) == []  # the lease lapsed without renewal


def test_bad_input_raises_value_error(redis_url: str, cluster: str) -> None:
    with pytest.raises(ValueError):
        ClusterIndex(redis_url, 5000)
    with pytest.raises(ValueError):
        ClusterIndex(redis_url, 0, cluster="a:b")
    idx = ClusterIndex(redis_url, 0, cluster=cluster)
    with pytest.raises(ValueError):
        idx.publish([seg(0, 1, keys(1))])  # not joined
    idx.join()
    sid, ks, addrs, rec = seg(1, 1, keys(2))  # addresses of another node
    with pytest.raises(ValueError):
        idx.publish([(sid, ks, addrs, rec)])
    with pytest.raises(ValueError):
        idx.publish([(sid, ks, addrs[:1], rec)])


def test_redis_gone_is_a_miss_not_a_hang(cluster: str) -> None:
    pytest.importorskip("redis")
    from flatcake.cluster import RedisServer, redis_available

    if redis_available():
        pytest.skip(redis_available() or "")
    with RedisServer() as server:
        a, b = index(server.url, cluster, 0), index(server.url, cluster, 1, timeout_s=1.0)
        ks = keys(4)
        a.publish([seg(0, 1, ks)])
        assert len(b.lookup(ks)) == 4
    assert b.lookup(ks) == []
    assert a.publish([seg(0, 2, ks)]) is False
    assert a.remove([(1, ks)]) is False


def test_entries_cross_processes(redis_url: str, cluster: str) -> None:
    """Node 0 publishes from its own process; this process (node 1) finds the blocks."""
    ks = keys(16, "proc")
    code = textwrap.dedent(f"""
        import hashlib
        from flatcake.cluster import ClusterIndex
        from flatcake.control.address import encode_address
        ks = [hashlib.blake2b(f"proc{{i}}".encode(), digest_size=32).digest()
              for i in range(16)]
        idx = ClusterIndex({redis_url!r}, 0, cluster={cluster!r}, lease_ms=60000)
        idx.join()
        assert idx.publish([(3, ks, [encode_address(0, 0, 4096 * j) for j in range(16)],
                             {{"segment_id": 3}})])
        """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    hits = index(redis_url, cluster, 1).lookup(ks)
    assert [h.key for h in hits] == ks
    assert {(h.node, h.medium, h.segment_id) for h in hits} == {(0, Medium.MEMORY, 3)}
