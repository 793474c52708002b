"""Joining a cluster whose Redis is not there is a clear error, never a traceback; the
error names the URL without its password."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
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


def test_strict_service_without_redis_is_a_clear_error() -> None:
    """``background_join=False`` (a host whose whole job is the cluster) fails at once;
    no agent is started before the join."""
    from flatcake.cluster.service import ClusterService

    url = f"redis://127.0.0.1:{_closed_port()}/0"
    with pytest.raises(ClusterUnavailableError, match="cannot join the cluster index"):
        ClusterService(url, 2, np.zeros(4096, np.uint8), lambda name: None,
                       timeout_s=1.0, background_join=False)


def test_service_without_redis_starts_local_only(caplog: pytest.LogCaptureFixture) -> None:
    """The store's default: one warning, local-only (no hits, no readers), what it
    publishes is held for the join and a removal cancels it; closing does not wait."""
    from flatcake.cluster.service import ClusterService
    from flatcake.control.address import Medium

    url = f"redis://127.0.0.1:{_closed_port()}/0"
    with caplog.at_level("WARNING", logger="flatcake.cluster.service"):
        service = ClusterService(url, 2, np.zeros(4096, np.uint8), lambda name: None,
                                 timeout_s=1.0, join_backoff_s=(0.05, 0.2))
    try:
        assert not service.joined and service.epoch == 0
        warned = [r.getMessage() for r in caplog.records]
        assert len(warned) == 1 and "serves local-only" in warned[0]
        assert service.lookup([b"k" * 32]) == []
        assert service.reader(Medium.SSD, 1) is None
        service.publish([(1, [b"a" * 32], [0], {}), (2, [b"b" * 32], [0], {})])
        service.remove([(1, [b"a" * 32]), (3, [b"c" * 32])])  # 3: never published
        assert service.writer.waiting() == [("publish", 2)] and service.flush(1.0)
        assert not service.wait_joined(0.5)  # retried with back-off, still no Redis
    finally:
        service.close()
    assert not service.joined
