"""A flood of idle connections cannot starve a real client: started with a low open-file
soft limit (systemd's is 1,024; here 256), the service raises it to the hard limit, so
600 idle connections (raw sockets that never call, and connections that called once)
leave it alive and a real client is answered within its timeout; a connection that
never calls is closed after ``HANDSHAKE_S``. With no descriptor left at all (a hard
limit of 256), accepting closes the oldest silent connections, and a real client is
still answered. (ZeroMQ 4.3 aborted the service when accept found no descriptor
left.)"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from flatcake.link import verbs, wire
from flatcake.link.frames import Connection
from flatcake.service.endpoint import HANDSHAKE_S, ask_status
from tests.service.helpers import Service, an_engine_stores

SOFT_LIMIT = 256
IDLE = 300  # of each kind: raw sockets and connections that called, 600 in all


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_idle_connections_past_the_soft_limit_leave_a_real_client_served(tmp_path: Path
                                                                         ) -> None:
    # The per-uid cap off: this is the open-file limit's part (many uids' connections).
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "store.node_max_connections_per_uid=0", open_files=SOFT_LIMIT).start()
    assert svc.proc is not None
    raw: list[socket.socket] = []
    called = []
    try:
        for _ in range(IDLE):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(svc.sock))
            raw.append(s)
            conn = Connection(str(svc.sock), 5.0)
            conn.send(wire.call_frame(0, "", verbs.STATUS.name, []))
            called.append(conn)
        time.sleep(1.0)  # every connection accepted
        assert svc.proc.poll() is None, svc.stderr()
        assert open_fds(svc.proc.pid) > 2 * IDLE > SOFT_LIMIT
        t0 = time.monotonic()
        assert ask_status(svc.sock, 2.0)["engines"] == {}
        assert time.monotonic() - t0 < 2.0
        an_engine_stores(svc.sock)
        # The raw connections never called: closed by the service.
        deadline = time.monotonic() + HANDSHAKE_S + 10
        while open_fds(svc.proc.pid) > IDLE + SOFT_LIMIT // 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert open_fds(svc.proc.pid) <= IDLE + SOFT_LIMIT // 2
        assert svc.proc.poll() is None, svc.stderr()
    finally:
        for s in raw:
            s.close()
        for conn in called:
            conn.close()
        assert svc.stop() == 0, svc.stderr()


def test_no_descriptor_left_closes_silent_connections_and_a_real_client_is_served(
        tmp_path: Path) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "store.node_max_connections_per_uid=0", open_files=SOFT_LIMIT,
                  hard_open_files=True).start()
    assert svc.proc is not None
    raw: list[socket.socket] = []
    try:
        for _ in range(IDLE):  # more than its descriptors: the kernel queues the rest
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(svc.sock))
            raw.append(s)
        time.sleep(1.0)
        assert svc.proc.poll() is None, svc.stderr()
        assert open_fds(svc.proc.pid) <= SOFT_LIMIT
        assert ask_status(svc.sock, 5.0)["engines"] == {}
        an_engine_stores(svc.sock)
        assert "out of open files" in svc.stderr()
    finally:
        for s in raw:
            s.close()
        assert svc.stop() == 0, svc.stderr()
