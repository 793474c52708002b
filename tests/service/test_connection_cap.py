"""One uid's connections are capped (``store.node_max_connections_per_uid``): past the
cap, its longest-idle connection is closed, so a flood of connections that each made a
call (not closed by ``HANDSHAKE_S``) leaves the service holding about the cap, and a
real client of the same uid, the newest, is answered and attaches."""

from __future__ import annotations

import os
import time
from pathlib import Path

from flatcake.link import verbs, wire
from flatcake.link.frames import Connection
from flatcake.service.connections import GRACE_S, ConnectionCap
from flatcake.service.endpoint import ask_status
from tests.service.helpers import Service, an_engine_stores

CAP = 16
FLOOD = 60  # well under the listen backlog (100): none refused before accepted


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_uids_idle_connections_past_the_cap_are_closed(tmp_path: Path) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  f"store.node_max_connections_per_uid={CAP}").start()
    assert svc.proc is not None
    base = open_fds(svc.proc.pid)
    flood = []
    try:
        for i in range(FLOOD):  # each asks once, then idles (and never comes back)
            conn = Connection(str(svc.sock), 5.0)
            conn.send(wire.call_frame(i, "", verbs.STATUS.name, []))
            assert wire.decode_reply(conn.recv(time.monotonic() + 10)).ok
            flood.append(conn)
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
        for conn in flood:
            conn.close()
        assert svc.stop() == 0, svc.stderr()


def test_a_fresh_connection_is_not_shut_before_its_first_call() -> None:
    """Connections over the cap are shut only once idle for ``GRACE_S``: a real
    client's connection can be accepted among a flood's before its first call is read;
    shut then, its call would be lost."""
    cap = ConnectionCap(2)
    t0 = time.monotonic()
    for fd in range(10, 15):
        cap.accepted(fd, uid=1000, now=t0 + fd / 1000)
    cap.accepted(20, uid=0, now=t0)  # another uid's: not counted against 1000's cap
    assert (cap.connections, cap.over(t0 + 0.1), cap.closed) == (6, [], 0)  # all fresh
    cap.touch(10, t0 + GRACE_S)  # the oldest called since: now the freshest
    # Their grace over: the 3 longest idle of uid 1000 are closed.
    assert cap.over(t0 + GRACE_S + 0.1) == [11, 12, 13]
    assert (cap.connections, cap.closed) == (3, 3)
    cap.forget(14)
    assert cap.over(t0 + 10 * GRACE_S) == [] and cap.connections == 2
