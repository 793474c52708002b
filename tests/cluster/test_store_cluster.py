"""``FlatCakeStore`` with ``store.cluster_url``: the store publishes durable segments in
the cluster index (real Redis), removes them when its books drop them, re-publishes
after a restart, and restores blocks another node holds through the executor's remote
readers (NIXL), verified by their crc32 before use; a killed owner is a bounded miss.

The stores need torch (this interpreter) and NIXL (the NIXL venv's site-packages, added
to the path of the child processes); the tests skip without either."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from flatcake.cluster import RedisServer
from tests.cluster.helpers import ask, child_env, next_line, process

PEER = Path(__file__).with_name("store_peer.py")
WHOLE = {"blocks": 7, "remote": 7, "exact": True, "hit": 7, "memory": 0, "ssd": 0}


def _run(env: dict[str, str], *args: str) -> dict:
    done = subprocess.run([sys.executable, str(PEER), *args], capture_output=True,
                          text=True, timeout=150, env=child_env(env))
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1])


def test_store_lifecycle_in_the_cluster(env: dict[str, str], redis_url: str, cluster: str,
                                        tmp_path: Path) -> None:
    out = _run(env, "pair", redis_url, cluster, str(tmp_path))
    # Node 1 restores node 0's session (4 SSD + 3 memory blocks) byte-exact.
    assert out["epoch"] == 1
    assert out["remote"] == {"blocks": 7, "remote": 7, "exact": True, "hit": 7,
                             "memory": 0, "ssd": 0}
    # A flipped bit in the owner's file: caught by the requester's crc32, a miss.
    assert out["corrupt"]["blocks"] == 0 and out["corrupt"]["hit"] == 4
    # Its own prefix first (2 blocks on its SSD), then the cluster's 5.
    assert out["local_then_remote"] == {"blocks": 7, "remote": 5, "exact": True, "hit": 7,
                                        "memory": 0, "ssd": 2}
    # The owner dropped the session: its entries are gone, only the local prefix is left.
    assert out["dropped"]["blocks"] == 2 and out["dropped"]["remote"] == 0
    # The owner closed (left the index): a miss; reopened (epoch 2), re-published, served.
    assert out["closed"]["blocks"] == 0 and out["closed"]["hit"] == 0
    assert out["reopened_epoch"] == 2
    assert out["republished"] == {"blocks": 2, "remote": 2, "exact": True, "hit": 2,
                                  "memory": 0, "ssd": 0}


def test_restores_at_once_and_a_slow_or_killed_owner_is_a_bounded_miss(
        env: dict[str, str], redis_url: str, cluster: str, tmp_path: Path) -> None:
    cmd = [sys.executable, "-u", str(PEER), "{}", redis_url, cluster, str(tmp_path)]
    owner_cmd = [x.format("owner") for x in cmd]
    with process([*owner_cmd, "0", "7,9"], env) as owner, \
            process([*owner_cmd, "2", "8"], env) as other, \
            process([x.format("restore") for x in cmd], env) as asker:
        assert [next_line(p, 90) for p in (owner, other, asker)] == ["ready"] * 3
        # Three restores at once, each in its own receive window: two sessions of node
        # 0 and one of node 2 (4 SSD + 3 memory blocks each), all byte-exact.
        served = ask(asker, "7,9,8")
        # A stopped (slow) owner: the staged SSD read of its session times out, a miss;
        # node 2's restore, started after it, is not held up by it. The window of the
        # timed-out read is retired and the new one's metadata published, so once the
        # owner goes on it is served again.
        os.kill(owner.pid, signal.SIGSTOP)
        slow = ask(asker, "7,8")
        os.kill(owner.pid, signal.SIGCONT)
        # Served again once the owner has caught up (it handles the stale request and
        # the new window's metadata first): on a loaded machine the first ask after it
        # resumes may still miss, so it may take a few asks, a bounded number.
        tries = [ask(asker, "7,9,8")]
        while len(tries) < 4 and not all(tries[-1][s] == WHOLE for s in ("7", "9", "8")):
            time.sleep(1.0)
            tries.append(ask(asker, "7,9,8"))
        again = tries[-1]
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=15)
        # Its entries outlive it until the lease ends: the reads fail or time out
        # (bounded by store.remote_timeout_s); nothing wrong reaches the paged KV.
        gone = ask(asker, "7,8")
    whole = WHOLE
    assert all(served[s] == whole for s in ("7", "9", "8"))
    assert slow["7"]["blocks"] == 0 and slow["7"]["exact"] and slow["8"] == whole
    assert slow["order"] == [8, 7]
    assert all(again[s] == whole for s in ("7", "9", "8")), tries
    assert all(r[s]["exact"] for r in tries for s in ("7", "9", "8"))
    assert gone["7"]["blocks"] == 0 and gone["7"]["exact"] and gone["8"] == whole


def test_a_store_opened_before_redis_joins_later(env: dict[str, str], cluster: str,
                                                 tmp_path: Path) -> None:
    """Redis unreachable at open: the store serves local-only (one warning), joins in
    the background once Redis answers, and publishes what it holds then."""
    port = RedisServer.free_port()
    url = f"redis://127.0.0.1:{port}/0"
    with process([sys.executable, "-u", str(PEER), "late", url, cluster, str(tmp_path)],
                 env) as peer:
        before = json.loads(next_line(peer, 90))
        assert next_line(peer, 30) == "ready"
        with RedisServer(port=port):
            after = json.loads(next_line(peer, 120))
    assert before == {"joined": False, "epoch": 0, "lookup": 0,
                      "local": {"blocks": 7, "remote": 0, "exact": True, "hit": 7,
                                "memory": 3, "ssd": 4}}
    assert after["joined"] and after["flushed"]
    # What node 0 held is published once joined: node 1 restores it byte-exact; the
    # session dropped before the join was never published.
    assert after["remote"] == {"blocks": 7, "remote": 7, "exact": True, "hit": 7,
                               "memory": 0, "ssd": 0}
    assert after["dropped"]["blocks"] == 0 and after["dropped"]["remote"] == 0
