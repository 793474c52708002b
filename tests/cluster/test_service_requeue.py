"""Two node services in one cluster while their Redis hangs (a paused redis-server,
resumed in teardown): node A's engine writes sessions before the pause and while Redis
is paused, and A's books drop the oldest of them (a small SSD) meanwhile, so A's index
writes fail and wait, publishes and removals in order. Once Redis answers again, the
engine attached to node B finds every block A still holds, both segments of a two-turn
session in order, and nothing of a session A dropped: neither one published before the
pause nor one written and withdrawn while its publish waited.

Needs torch, NIXL (``helpers.store_env``) and redis-server; skips without them."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from flatcake.cluster import RedisServer
from tests.cluster.helpers import ask, child_env, next_line, paused, process
from tests.service.helpers import Service

PEER = Path(__file__).with_name("requeue_peer.py")


def test_writes_made_while_redis_hangs_reach_the_other_node_in_order(
        env: dict[str, str], own_redis: RedisServer, tmp_path: Path) -> None:
    common = [f"store.cluster_url={own_redis.url}", "store.cluster_name=rq",
              "store.remote_timeout_s=1", "store.remote_window_bytes=1048576"]
    run = tmp_path / "run"
    a = Service(tmp_path / "a", run / "a.sock", *common, "store.node_id=1",
                "store.ssd_capacity_bytes=49152", env=child_env(env))
    b = Service(tmp_path / "b", run / "b.sock", *common, "store.node_id=2",
                env=child_env(env))
    a.start()
    try:
        b.start()
        with process([sys.executable, "-u", str(PEER), str(a.sock), str(b.sock)],
                     env) as peer:
            assert next_line(peer, 120) == "ready"
            assert ask(peer, "write 0 2") == {"written": 2}
            before = ask(peer, "check 2 20")
            assert before["held"] == before["found"] == [3, 3], before
            with paused(own_redis.pid):
                assert ask(peer, "write 2 5 two") == {"written": 3}
                time.sleep(3)  # node A's publishes time out and wait
            got = ask(peer, "check 5 30")
    finally:
        assert b.stop() == 0, b.stderr()
        assert a.stop() == 0, a.stderr()
    assert "wait for Redis" in a.stderr()  # A's writes failed while Redis hung
    held, found = got["held"], got["found"]
    assert found == held, got
    assert held[4] == 5  # the two-turn session, both segments
    assert held[0] == 0  # dropped after its publish reached Redis: removed
    assert 0 in held[2:4]  # written and dropped while its publish waited: never published
