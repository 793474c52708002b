"""Child processes for the cluster tests: the NIXL venv's python (or None), the
environment a child runs with (this checkout's ``src`` on its path, no inherited ``UCX_*``),
a child whose own lines ("ready" or JSON) are read with a timeout past NIXL's log lines,
and the PYTHONPATH that gives this interpreter (torch) NIXL too; ``paused`` makes a Redis
server hang (stopped, resumed on leaving)."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from flatcake.control.address import Medium, encode_address


@contextmanager
def paused(pid: int) -> Iterator[None]:
    """The process ``pid`` (a redis-server) stopped: its clients hang until it resumes."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


ROOT = Path(__file__).resolve().parents[2]  # the checkout


@cache
def nixl_python() -> str | None:
    """The NIXL venv's python (``FLATCAKE_NIXL_PYTHON`` or ./.venv-nixl); None without NIXL."""
    python = os.environ.get("FLATCAKE_NIXL_PYTHON") or str(ROOT / ".venv-nixl/bin/python")
    if not Path(python).is_file():
        return None
    probe = subprocess.run([python, "-c", "import flatcake.cio.remote as r; "
                            "raise SystemExit(r.nixl_available())"],
                           capture_output=True, timeout=60, env=child_env({}))
    return python if probe.returncode == 0 else None


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """A child's environment: this checkout's ``src`` on its path, no ``UCX_*`` but ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    return {**env, **extra}


def next_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
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
def process(argv: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """A child whose lines of ours ``next_line`` reads; stopped (then killed) on exit."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            bufsize=1, env=child_env(env))
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


@cache
def store_env() -> dict[str, str] | None:
    """PYTHONPATH giving this interpreter (torch) NIXL too; None when it cannot."""
    python = nixl_python()
    if python is None:
        return None
    where = subprocess.run([python, "-c", "import nixl, os; "
                            "print(os.path.dirname(os.path.dirname(nixl.__file__)))"],
                           capture_output=True, text=True, timeout=60, env=child_env({}))
    paths = os.pathsep.join([str(ROOT / "src"), str(ROOT), where.stdout.strip()])
    env = {"PYTHONPATH": paths}
    probe = subprocess.run([sys.executable, "-c", "import nixl._api"],
                           capture_output=True, timeout=120, env=child_env(env))
    return env if where.returncode == 0 and probe.returncode == 0 else None


def ask(asker: subprocess.Popen[str], line: str) -> dict:
    """Send ``line`` to a peer (the store asker: sessions to restore at once, comma-
    separated); its JSON answer."""
    assert asker.stdin is not None
    asker.stdin.write(line + "\n")
    asker.stdin.flush()
    return json.loads(next_line(asker, 60))


def keys(n: int, tag: str = "s") -> list[bytes]:
    return [hashlib.blake2b(f"{tag}{i}".encode(), digest_size=32).digest() for i in range(n)]


def seg(node: int, sid: int, ks: list[bytes], medium: Medium = Medium.SSD, base: int = 0):
    addrs = [encode_address(medium, node, base + 4096 * j) for j in range(len(ks))]
    return (sid, ks, addrs, {"segment_id": sid, "file_id": sid, "blocks": len(ks)})
