"""The pool of client windows behind the remote readers (``cio.remote_readers``), with
stand-in clients (no NIXL): one read per client at a time, a bounded wait for a free
one, a retired window reported and renewed within the pool's budget, and a client
without a window out of the pool."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from flatcake.cio.remote_readers import NixlPeers


class Client:
    """What the pool uses of a ``NixlNode``: a window, a generation, ``renew``."""

    def __init__(self, name: str, window_bytes: int = 4096) -> None:
        self.name = name
        self.window = np.zeros(window_bytes, np.uint8)
        self.generation = 0
        self.renew: Any = None
        self.retired: list[np.ndarray] = []

    def retire_window(self) -> None:  # as NixlNode.retire_window does
        self.retired.append(self.window)
        self.generation += 1
        n = self.window.nbytes
        self.window = np.zeros(n if self.renew is None or self.renew() else 0, np.uint8)

    def connect(self, metadata: bytes) -> str:
        return metadata.decode()


def peers(n: int, timeout_s: float = 0.2) -> tuple[NixlPeers, list[Client]]:
    clients = [Client(f"c{k}") for k in range(n)]
    pool = NixlPeers(clients, lambda node: (f"owner{node}".encode(), {"node": node}),  # type: ignore[arg-type]
                     timeout_s)
    return pool, clients


def test_each_read_leases_its_own_client_and_waits_a_bounded_time_for_one() -> None:
    pool, _ = peers(2)
    with pool.lease() as a, pool.lease() as b:
        assert a is not None and b is not None and {a[0], b[0]} == {0, 1}
        with pool.lease() as c:
            assert c is None  # every window busy for timeout_s: a miss
        assert pool.peer(a[1], 3) == ("owner3", {"node": 3})  # type: ignore[arg-type]
    with pool.lease() as again:
        assert again is not None  # given back


def test_reads_run_at_once_up_to_the_pool_size() -> None:
    pool, _ = peers(3, timeout_s=5.0)
    inside = threading.Barrier(3, timeout=5.0)  # broken unless all three hold a window

    def read() -> None:
        with pool.lease() as leased:
            assert leased is not None
            inside.wait()

    threads = [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not inside.broken


def test_a_retired_window_is_reported_renewed_then_its_client_leaves_the_pool() -> None:
    pool, clients = peers(2)
    told: list[int] = []
    pool.on_retired = told.append
    # The pool renews two windows in all (its size); the third retirement is final.
    for _ in range(2):
        with pool.lease() as leased:
            assert leased is not None
            leased[1].retire_window()  # type: ignore[attr-defined]
    assert pool.spare_windows == 0 and len(told) == 2 and pool.in_service == 2
    with pool.lease() as leased:
        assert leased is not None
        gone = leased[0]
        leased[1].retire_window()  # type: ignore[attr-defined]
    assert pool.in_service == 1 and len(told) == 2
    assert clients[gone].window.nbytes == 0 and len(clients[gone].retired) >= 1
    # Only the other client is handed out now; the windows of both stay referenced.
    for _ in range(3):
        with pool.lease() as leased:
            assert leased is not None and leased[0] != gone
    assert sum(len(c.retired) for c in clients) == 3


def test_bad_pools_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        NixlPeers([], lambda node: None, 1.0)
    with pytest.raises(ValueError, match="timeout_s"):
        NixlPeers([Client("a")], lambda node: None, 0.0)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="differ"):
        NixlPeers([Client("a", 4096), Client("b", 8192)], lambda node: None,  # type: ignore[list-item]
                  1.0)
