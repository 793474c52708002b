"""Remote memory through NIXL between real processes: node 0 serves its arena, node 1 finds
the blocks in the cluster index (real Redis) and READs them byte-exact, over shared memory
and over TCP; a killed owner is a bounded miss. Runs the NIXL venv's python
(scripts/nixl_venv.sh, or FLATCAKE_NIXL_PYTHON); skips without it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.cluster.helpers import child_env, next_line, process

PEER = Path(__file__).with_name("nixl_peer.py")
TCP = {"UCX_TLS": "tcp", "UCX_TCP_TX_SEG_SIZE": "512k", "UCX_TCP_RX_SEG_SIZE": "512k"}


@contextmanager
def peer(python: str, *args: str, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    with process([python, "-u", str(PEER), *args], env) as proc:
        yield proc


def _read(python: str, url: str, cluster: str, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run([python, str(PEER), "reader", url, cluster, "1", "3"],
                          capture_output=True, text=True, timeout=120, env=child_env(env))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads([x for x in done.stdout.splitlines() if x.startswith("{")][-1])


@pytest.mark.parametrize("path", ["shm", "tcp"])
def test_remote_memory_read_is_byte_exact(python: str, redis_url: str, cluster: str,
                                          path: str) -> None:
    env = TCP if path == "tcp" else {}
    with peer(python, "owner", redis_url, cluster, "0", env=env) as owner:
        assert next_line(owner, 60) == "ready"
        out = _read(python, redis_url, cluster, env)
    assert out["hits"] == 32
    assert out["ok"] is True


def test_gone_owner_is_a_bounded_miss(python: str, redis_url: str, cluster: str) -> None:
    with peer(python, "owner", redis_url, cluster, "0", env={}) as owner:
        assert next_line(owner, 60) == "ready"
        with peer(python, "reader", redis_url, cluster, "1", "1", "survive", env={}) as reader:
            assert json.loads(next_line(reader, 60)) == {"first": True}
            owner.kill()
            owner.wait(timeout=15)
            assert reader.stdin is not None
            reader.stdin.write("go\n")
            reader.stdin.flush()
            out = json.loads(next_line(reader, 60))
    # A miss (None) or, at most, the same bytes: never different bytes.
    assert out["after_kill"] in (None, True)
    assert out["ok"] is True
    # Killed before anyone connects: the index still names it, the read is a miss.
    with peer(python, "owner", redis_url, cluster, "0", env={}) as owner:
        assert next_line(owner, 60) == "ready"
        owner.kill()
        owner.wait(timeout=15)
    out = _read(python, redis_url, cluster, {})
    assert out["ok"] is False


def _ssd_read(python: str, url: str, cluster: str) -> dict[str, object]:
    done = subprocess.run([python, str(PEER), "ssd-reader", url, cluster, "1"],
                          capture_output=True, text=True, timeout=120, env=child_env({}))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads([x for x in done.stdout.splitlines() if x.startswith("{")][-1])


def test_remote_ssd_is_staged_by_the_owner_and_checked(python: str, redis_url: str,
                                                       cluster: str, tmp_path: Path) -> None:
    with peer(python, "ssd-owner", redis_url, cluster, "0", str(tmp_path), env={}) as owner:
        assert next_line(owner, 60) == "ready"
        out = _ssd_read(python, redis_url, cluster)
        assert (out["ok"], out.get("corrupt")) == (True, False), out
        with (tmp_path / "seg.bin").open("r+b") as f:  # one bit flips on the owner's SSD
            f.seek(4 * 256 * 1024 + 17)  # inside a range the reader asks for
            byte = f.read(1)[0]
            f.seek(-1, 1)
            f.write(bytes([byte ^ 1]))
        out = _ssd_read(python, redis_url, cluster)
    assert (out["ok"], out.get("corrupt")) == (False, True), out  # detected: recomputed, not used
