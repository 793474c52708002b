"""Remote memory through NIXL between real processes: node 0 serves its arena, node 1 finds
the blocks in the cluster index (real Redis) and READs them byte-exact, over shared memory
and over TCP; a killed owner is a bounded miss. Runs the NIXL venv's python
(scripts/nixl_venv.sh, or FLATCAKE_NIXL_PYTHON); skips without it."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEER = Path(__file__).with_name("nixl_peer.py")
TCP = {"UCX_TLS": "tcp", "UCX_TCP_TX_SEG_SIZE": "512k", "UCX_TCP_RX_SEG_SIZE": "512k"}


@cache
def nixl_python() -> str | None:
    python = os.environ.get("FLATCAKE_NIXL_PYTHON") or str(ROOT / ".venv-nixl/bin/python")
    if not Path(python).is_file():
        return None
    probe = subprocess.run([python, "-c", "import flatcake.cio.remote as r; "
                            "raise SystemExit(r.nixl_available())"],
                           capture_output=True, timeout=60, env=_env({}))
    return python if probe.returncode == 0 else None


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    return {**env, **extra}


@pytest.fixture
def python() -> str:
    found = nixl_python()
    if found is None:
        pytest.skip("no NIXL venv (scripts/nixl_venv.sh or FLATCAKE_NIXL_PYTHON)")
    return found


def _line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The peer's next line of ours ("ready" or JSON), skipping NIXL's log lines."""
    lines: queue.Queue[str] = proc.lines  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if not line:
            raise AssertionError("the peer exited")
        if line.startswith(("ready", "{")):
            return line.strip()
    raise AssertionError(f"no line from the peer within {timeout_s}s")


def _pump(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        proc.lines.put(line)  # type: ignore[attr-defined]
    proc.lines.put("")  # type: ignore[attr-defined]


@contextmanager
def peer(python: str, *args: str, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    with process([python, "-u", str(PEER), *args], env) as proc:
        yield proc


@contextmanager
def process(argv: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """A child whose lines of ours ``_line`` reads; stopped (then killed) on exit."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            bufsize=1, env=_env(env))
    proc.lines = queue.Queue()  # type: ignore[attr-defined]
    threading.Thread(target=_pump, args=(proc,), daemon=True).start()
    try:
        yield proc
    finally:
        if proc.stdin:
            proc.stdin.close()  # a peer script exits on it; a node exits on SIGTERM
        for stop in (None, proc.terminate, proc.kill):
            if stop is not None:
                stop()
            try:
                proc.wait(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue


def _read(python: str, url: str, cluster: str, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run([python, str(PEER), "reader", url, cluster, "1", "3"],
                          capture_output=True, text=True, timeout=120, env=_env(env))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads([x for x in done.stdout.splitlines() if x.startswith("{")][-1])


@pytest.mark.parametrize("path", ["shm", "tcp"])
def test_remote_memory_read_is_byte_exact(python: str, redis_url: str, cluster: str,
                                          path: str) -> None:
    env = TCP if path == "tcp" else {}
    with peer(python, "owner", redis_url, cluster, "0", env=env) as owner:
        assert _line(owner, 60) == "ready"
        out = _read(python, redis_url, cluster, env)
    assert out["hits"] == 32
    assert out["ok"] is True


def test_gone_owner_is_a_bounded_miss(python: str, redis_url: str, cluster: str) -> None:
    with peer(python, "owner", redis_url, cluster, "0", env={}) as owner:
        assert _line(owner, 60) == "ready"
        with peer(python, "reader", redis_url, cluster, "1", "1", "survive", env={}) as reader:
            assert json.loads(_line(reader, 60)) == {"first": True}
            owner.kill()
            owner.wait(timeout=15)
            assert reader.stdin is not None
            reader.stdin.write("go\n")
            reader.stdin.flush()
            out = json.loads(_line(reader, 60))
    # A miss (None) or, at most, the same bytes: never different bytes.
    assert out["after_kill"] in (None, True)
    assert out["ok"] is True
    # Killed before anyone connects: the index still names it, the read is a miss.
    with peer(python, "owner", redis_url, cluster, "0", env={}) as owner:
        assert _line(owner, 60) == "ready"
        owner.kill()
        owner.wait(timeout=15)
    out = _read(python, redis_url, cluster, {})
    assert out["ok"] is False


def _ssd_read(python: str, url: str, cluster: str) -> dict[str, object]:
    done = subprocess.run([python, str(PEER), "ssd-reader", url, cluster, "1"],
                          capture_output=True, text=True, timeout=120, env=_env({}))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads([x for x in done.stdout.splitlines() if x.startswith("{")][-1])


def test_remote_ssd_is_staged_by_the_owner_and_checked(python: str, redis_url: str,
                                                       cluster: str, tmp_path: Path) -> None:
    with peer(python, "ssd-owner", redis_url, cluster, "0", str(tmp_path), env={}) as owner:
        assert _line(owner, 60) == "ready"
        out = _ssd_read(python, redis_url, cluster)
        assert (out["ok"], out.get("corrupt")) == (True, False), out
        with (tmp_path / "seg.bin").open("r+b") as f:  # one bit flips on the owner's SSD
            f.seek(4 * 256 * 1024 + 17)  # inside a range the reader asks for
            byte = f.read(1)[0]
            f.seek(-1, 1)
            f.write(bytes([byte ^ 1]))
        out = _ssd_read(python, redis_url, cluster)
    assert (out["ok"], out.get("corrupt")) == (False, True), out  # detected: recomputed, not used
