"""Joining a cluster whose Redis is not there is a clear error, never a traceback; the
error names the URL without its password."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from flatcake.cli import main
from flatcake.cluster import ClusterIndex
from flatcake.errors import ClusterUnavailableError

pytest.importorskip("redis")


def _closed_port() -> int:
    with socket.socket() as s:  # bound then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_join_without_redis_is_a_clear_error() -> None:
    url = f"redis://user:hunter2@127.0.0.1:{_closed_port()}/0"
    index = ClusterIndex(url, 3, timeout_s=1.0)
    with pytest.raises(ClusterUnavailableError) as err:
        index.join()
    msg = str(err.value)
    assert "cannot join the cluster index" in msg and "hunter2" not in msg
    assert "user:***@127.0.0.1" in msg
    assert index.epoch == 0


def test_node_command_without_redis(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["node", "--redis", f"redis://127.0.0.1:{_closed_port()}", "--node-id", "1",
                 "--root", str(tmp_path / "n1"), "--timeout-s", "5"])
    assert code == 2
    assert "cannot join the cluster index" in capsys.readouterr().err
