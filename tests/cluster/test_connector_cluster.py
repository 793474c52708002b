"""The vLLM connector in a cluster (``store.cluster_url``), its two halves driven as in
tests/connectors/test_sides.py: node 0's worker publishes what it writes, node 1's
scheduler half counts those blocks after its own prefix and node 1's worker restores
them byte-exact through NIXL (real Redis, two processes on 127.0.0.1); an owner killed
between lookup and load is a load error for those blocks, never a hang or wrong bytes;
Redis going away leaves the scheduler half answering from its own store.

The two-node test needs torch and NIXL (``helpers.store_env``) and skips
without them; the Redis test needs only redis-server and the client."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path

import pytest

from flatcake.cluster import RedisServer, redis_available
from tests.cluster.helpers import ask, next_line, process
from tests.connectors.sides_harness import Harness, finish, settings, tokens, view

PEER = Path(__file__).with_name("connector_peer.py")


def test_a_session_written_on_node_0_is_restored_by_node_1(
        env: dict[str, str], redis_url: str, cluster: str, tmp_path: Path) -> None:
    cmd = [sys.executable, "-u", str(PEER), "{}", redis_url, cluster, str(tmp_path)]
    with process([x.format("owner") for x in cmd], env) as owner, \
            process([x.format("asker") for x in cmd], env) as asker:
        wrote = json.loads(next_line(owner, 120))
        assert next_line(owner, 30) == "ready" and next_line(asker, 120) == "ready"
        assert wrote == {"placed": ["ssd:first_turn", "memory:short_reply", "ssd:first_turn"],
                         "published": 3}
        # Session s's first turn: 3 blocks on node 0's SSD, none here -> an async load.
        assert ask(asker, "lookup s0 0") == {"matched": 12, "async": True}
        a = ask(asker, "load")
        assert a["loads"] == [["r1", False, 1]] and a["recving"] == ["r1"]
        assert a["invalid"] == [] and a["exact"] and a["untouched"]
        assert a["params"]["loaded_tokens_remote"] == 12
        assert a["params"]["load_error_blocks"] == 0
        # Node 1 stores them itself; the next turn is its own 3 blocks, then node 0's 2
        # memory blocks.
        assert ask(asker, "store") == {"stored_blocks": 3}
        assert ask(asker, "lookup s1 0") == {"matched": 20, "async": True}
        d = ask(asker, "load")
        assert d["invalid"] == [] and d["exact"] and d["untouched"]
        assert d["params"]["loaded_tokens_ssd"] == 12
        assert d["params"]["loaded_tokens_remote"] == 8
        # The engine holds 2 blocks of session t itself: only the third is loaded, and
        # the engine's slots are never written.
        assert ask(asker, "lookup t 2") == {"matched": 4, "async": True}
        b = ask(asker, "load")
        assert b["invalid"] == [] and b["exact"] and b["untouched"]
        assert b["params"]["loaded_tokens_remote"] == 4
        # The owner dies between the lookup and the load: its 3 blocks are load errors
        # (the engine recomputes them), within store.remote_timeout_s, and no byte of
        # the request's slots changed.
        assert ask(asker, "lookup t 0") == {"matched": 12, "async": True}
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=15)
        c = ask(asker, "load")
        assert c["recving"] == ["r4"] and c["invalid"] == [0, 1, 2]
        assert c["untouched"] and c["params"]["load_error_blocks"] == 3
        assert c["params"]["loaded_tokens_remote"] == 0


def test_redis_going_away_leaves_the_scheduler_half_local_only(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    why = redis_available()
    if why:
        pytest.skip(why)
    with RedisServer() as server:
        s = settings(f"store.cluster_url={server.url}", "store.cluster_name=local-only",
                     "store.remote_timeout_s=1")
        # The scheduler half reads the cluster; this worker serves none (no NIXL here).
        worker = settings()
        h = Harness(tmp_path, s, worker_config=worker)
        turn0 = list(range(100, 113))
        finish(h, "a", turn0, [5, 6, 7, 8], out=3, session="s")
        h.step()
        assert h.sched.cluster is not None
        assert h.sched.num_matched_tokens(view("b", tokens(turn0, 8, 200)), 0) == (12, True)
        assert h.sched.cluster.lookups == 2  # a's lookup, then b's
        server.stop()
        with caplog.at_level(logging.WARNING):
            v = view("c", tokens(turn0, 8, 300))
            assert h.sched.num_matched_tokens(v, 0) == (12, True)
        assert "local-only" in caplog.text
        assert h.sched.totals()["cluster_lookup_failures"] == 1
        # Backing off: the next lookups ask no Redis, and the local load runs.
        assert h.sched.num_matched_tokens(view("d", tokens(turn0, 8, 400)), 0) == (12, True)
        assert h.sched.cluster.lookups == 3
        h.sched.after_alloc("c", list(range(30, 36)), 12)
        _, _, recving, invalid = h.step()
        assert recving == {"c"} and invalid == set()
        h.close()

