"""One uid's connections are capped (``store.node_max_connections_per_uid``): past the
cap, its longest-idle connection is closed, so a flood of ZeroMQ connections that
completed the handshake (not closed by ``HANDSHAKE_S``) leaves the service holding about
the cap, and a real client of the same uid, the newest, is answered and attaches."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from flatcake.link import wire
from flatcake.service.connections import GRACE_S, ConnectionCap
from flatcake.service.endpoint import ask_status
from tests.service.helpers import Service, an_engine_stores

zmq = pytest.importorskip("zmq")

CAP = 16
FLOOD = 60  # well under the listen backlog (100): none refused before accepted


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_uids_idle_connections_past_the_cap_are_closed(tmp_path: Path) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  f"store.node_max_connections_per_uid={CAP}").start()
    assert svc.proc is not None
    base = open_fds(svc.proc.pid)
    ctx = zmq.Context()
    dealers = []
    try:
        for _ in range(FLOOD):
            d = ctx.socket(zmq.DEALER)
            d.setsockopt(zmq.LINGER, 0)
            d.setsockopt(zmq.RECONNECT_IVL, -1)  # a flood that does not come back
            d.connect(wire.endpoint(svc.sock))
            dealers.append(d)
        # A real client of the same uid (accepted after the flood) is answered, and an
        # engine attaches and stores.
        assert ask_status(svc.sock, 2.0)["engines"] == {}
        an_engine_stores(svc.sock)
        # The flood's connections past the cap are closed.
        deadline = time.monotonic() + 20
        while open_fds(svc.proc.pid) > base + CAP and time.monotonic() < deadline:
            time.sleep(0.2)
        assert open_fds(svc.proc.pid) <= base + CAP, svc.stderr()
        assert svc.proc.poll() is None, svc.stderr()
    finally:
        for d in dealers:
            d.close(0)
        ctx.term()
        assert svc.stop() == 0, svc.stderr()


def test_a_fresh_connection_is_not_shut_before_its_first_call(tmp_path: Path) -> None:
    """Connections over the cap are shut only once idle for ``GRACE_S``: ZeroMQ connects
    in the background, so a real client's connection can be accepted among a flood's
    before its first call is read; shut then, its call would be lost."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(wire.endpoint(tmp_path / "s.sock"))
    cap = ConnectionCap(router, 2)
    dealers = []
    try:
        for _ in range(5):
            d = ctx.socket(zmq.DEALER)
            d.setsockopt(zmq.LINGER, 0)
            d.setsockopt(zmq.RECONNECT_IVL, -1)
            d.connect(wire.endpoint(tmp_path / "s.sock"))
            dealers.append(d)
        deadline = time.monotonic() + 10
        while cap.connections + cap.closed < 5 and time.monotonic() < deadline:
            cap.drain()
            time.sleep(0.01)
        assert (cap.connections, cap.closed) == (5, 0)  # all fresh: none shut yet
        cap.drain(time.monotonic() + GRACE_S)  # their grace over: the 3 over the cap
        assert (cap.connections, cap.closed) == (2, 3)
    finally:
        cap.close()
        for d in dealers:
            d.close(0)
        router.close(0)
        ctx.term()
