"""A ``redis-server`` child process on 127.0.0.1, bounded in time, for tests and the demo.

No persistence (``--save ''``, no AOF), bound to loopback only, protected mode on; the
port is ``port``, or a free one chosen by the OS (0). ``start`` waits for PING up to
``start_timeout_s`` and raises ``RuntimeError`` naming the log when the server does not
answer; ``stop`` terminates, then kills after ``stop_timeout_s``. A context manager
stops it on exit.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

HOST = "127.0.0.1"


def redis_available() -> str | None:
    """Why the Redis pieces cannot run here (missing server binary or client), or None."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed (apt-get install redis-server)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the redis client is not installed (pip install redis)"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One ``redis-server`` on 127.0.0.1; ``url`` is ``redis://127.0.0.1:PORT/0``."""

    def __init__(self, *, start_timeout_s: float = 10.0, stop_timeout_s: float = 5.0,
                 binary: str = "redis-server", port: int = 0) -> None:
        if start_timeout_s <= 0 or stop_timeout_s <= 0:
            raise ValueError("RedisServer timeouts must be positive")
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in [0, 65535], got {port!r}")
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.binary = binary
        self._want_port = port
        self.port = port
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        if self._proc is None:
            raise ValueError("the Redis server is not running")
        return f"redis://{HOST}:{self.port}/0"

    @property
    def pid(self) -> int:
        """The server's process id (a test pauses it to make Redis hang)."""
        if self._proc is None:
            raise ValueError("the Redis server is not running")
        return self._proc.pid

    @staticmethod
    def free_port() -> int:
        """A port nothing listens on now (for a server started later on it)."""
        return _free_port()

    def start(self) -> RedisServer:
        if self._proc is not None:
            raise ValueError("the Redis server is already running")
        if shutil.which(self.binary) is None:
            raise RuntimeError(f"{self.binary} is not installed (apt-get install redis-server)")
        self._dir = tempfile.TemporaryDirectory(prefix="flatcake-redis-")
        log = Path(self._dir.name) / "redis.log"
        # Another process may take a free port between probe and bind: try 3 of them.
        for _ in range(1 if self._want_port else 3):
            self.port = self._want_port or _free_port()
            self._proc = subprocess.Popen(
                [self.binary, "--bind", HOST, "--port", str(self.port), "--save", "",
                 "--appendonly", "no", "--dir", self._dir.name, "--logfile", str(log),
                 "--protected-mode", "yes"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if self._wait_ready():
                return self
            self._kill()
        raise RuntimeError(f"redis-server did not answer within {self.start_timeout_s}s; "
                           f"see {log}")

    def _wait_ready(self) -> bool:
        import redis

        deadline = time.monotonic() + self.start_timeout_s
        client = redis.Redis(host=HOST, port=self.port, socket_timeout=1.0,
                             socket_connect_timeout=1.0)
        try:
            while time.monotonic() < deadline:
                if self._proc is None or self._proc.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except redis.RedisError:
                    time.sleep(0.02)
            return False
        finally:
            client.close()

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=self.stop_timeout_s)

    def stop(self) -> None:
        self._kill()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> RedisServer:
        return self.start() if self._proc is None else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __del__(self) -> None:
        proc: Any = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
