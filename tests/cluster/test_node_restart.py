"""``flatcake node`` processes: an owner killed mid-service is a bounded miss (no hang, no
wrong bytes); restarted, it joins under a new epoch, publishes again and is served."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from tests.cluster.helpers import child_env, next_line, process


def _node(python: str, url: str, cluster: str, root: Path, *args: str) -> list[str]:
    return [python, "-m", "flatcake.cli", "node", "--redis", url, "--cluster", cluster,
            "--root", str(root), "--block-kib", "64", *args]


def _restore(python: str, url: str, cluster: str, root: Path) -> tuple[int, dict]:
    done = subprocess.run(_node(python, url, cluster, root, "--node-id", "1", "--restore",
                                "8", "--timeout-s", "5"),
                          capture_output=True, text=True, timeout=90, env=child_env({}))
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    assert lines, done.stderr[-2000:]
    return done.returncode, json.loads(lines[-1])


def test_killed_owner_is_a_miss_and_a_restarted_one_is_served(
        python: str, redis_url: str, cluster: str, tmp_path: Path) -> None:
    owner_args = ("--node-id", "0", "--write-blocks", "8", "--serve-s", "120")
    cmd = _node(python, redis_url, cluster, tmp_path / "n0", *owner_args)
    with process(cmd, {}) as owner:
        assert json.loads(next_line(owner, 60))["epoch"] == 1
        rc, out = _restore(python, redis_url, cluster, tmp_path / "n1")
        assert rc == 0 and out["remote_memory"]["ok"] and out["remote_ssd"]["ok"]
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=15)
    rc, out = _restore(python, redis_url, cluster, tmp_path / "n1")
    assert rc == 1
    assert not out["remote_memory"]["ok"] and "miss" in out["remote_memory"]
    assert not out["remote_ssd"]["ok"] and "miss" in out["remote_ssd"]
    with process(cmd, {}) as owner:  # the same node id again: a new life
        assert json.loads(next_line(owner, 60))["epoch"] == 2
        rc, out = _restore(python, redis_url, cluster, tmp_path / "n1")
        assert rc == 0 and out["remote_memory"]["ok"] and out["remote_ssd"]["ok"]

