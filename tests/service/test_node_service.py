"""The node service (``flatcake serve``) shared by two engines on one machine: a
session's turn on engine B restores what engine A wrote (from SSD, from the shared
arena), byte for byte; a session alternating between them stays in one file; a dead
engine's pins and writes are released after its lease; a killed service leaves the
engines serving (misses, no exception) and they re-attach once it is back."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flatcake.connectors.scheduler_side import RequestView
from flatcake.service.endpoint import ask_status
from tests.connectors.sides_harness import end, finish, tokens, view
from tests.service.helpers import Engine, Service


@pytest.fixture
def node(tmp_path: Path):  # type: ignore[no-untyped-def]
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock").start()
    yield svc
    assert svc.stop() == 0, svc.stderr()


def status(svc: Service) -> dict:
    return ask_status(svc.sock, 5.0)


def test_turn_on_engine_b_restores_what_engine_a_wrote(node: Service) -> None:
    a, b = Engine(node.sock, seed=1, name="A"), Engine(node.sock, seed=2, name="B")
    try:
        turn0 = list(range(100, 113))  # 3 full blocks + 1 token
        p = finish(a, "a0", turn0, [5, 6, 7, 8], out=3, session="s")
        assert p["placement"] == "ssd:first_turn" and p["stored_blocks"] == 3
        _, sending, _, _ = a.step()
        assert sending == {"a0"}
        want = {(layer, j): a.block(layer, s) for layer in range(3)
                for j, s in enumerate([5, 6, 7])}
        # Turn 1 on engine B: the 3 blocks from SSD (A's file), async.
        turn1 = tokens(turn0, 8, 200)
        v = view("b1", turn1, session="s")
        assert b.sched.num_matched_tokens(v, 0) == (12, True)
        b.sched.after_alloc("b1", [20, 21, 22, 23, 24], 12)
        plan, _, recving, invalid = b.step()
        assert [t.request_id for t in plan.loads] == ["b1"] and not plan.loads[0].sync
        assert recving == {"b1"} and invalid == set()
        for (layer, j), raw in want.items():
            assert b.block(layer, 20 + j) == raw
        # B's turn (short reply: memory) then A restores it from the shared arena.
        _, params = end(b, RequestView("b1", v.keys, len(turn1), len(turn1), 3, 12, "s"),
                        [20, 21, 22, 23, 24])
        assert params["flatcake"]["loaded_tokens_ssd"] == 12
        assert params["flatcake"]["placement"] == "memory:short_reply"
        b.step()
        mem = {(layer, j): b.block(layer, s) for layer in range(3)
               for j, s in enumerate([23, 24])}
        turn2 = tokens(turn1[:20], 8, 300)
        v2 = view("a2", turn2, session="s")
        n, _ = a.sched.num_matched_tokens(v2, 0)
        assert n == 20
        a.sched.after_alloc("a2", list(range(40, 46)), 20)
        _, _, _, invalid = a.step()
        assert invalid == set()
        for (layer, j), raw in mem.items():
            assert a.block(layer, 43 + j) == raw
        for (layer, j), raw in want.items():
            assert a.block(layer, 40 + j) == raw
        # One session, one file, whichever engine wrote its turns.
        files = list((node.root / "sessions").iterdir())
        assert len(files) == 1
        assert set(status(node)["engines"]) == {a.sched.engine_id, b.sched.engine_id}
    finally:
        a.close()
        b.close()
    assert status(node)["engines"] == {}


def test_an_engine_that_stops_calling_is_released_after_its_lease(node: Service) -> None:
    a, b = Engine(node.sock, seed=1, name="A"), Engine(node.sock, seed=2, name="B")
    try:
        turn0 = list(range(100, 113))
        finish(a, "a0", turn0, [5, 6, 7, 8], out=3, session="s")
        a.step()
        # B admits a restore, then goes silent before stepping (a dead engine): its
        # session stays pinned until the lease ends, then B is forgotten.
        v = view("b1", tokens(turn0, 8, 200), session="s")
        assert b.sched.num_matched_tokens(v, 0) == (12, True)
        b.sched.after_alloc("b1", [20, 21, 22, 23, 24], 12)
        deadline = time.monotonic() + 15
        while b.sched.engine_id in status(node)["engines"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert b.sched.engine_id not in status(node)["engines"]
        # B calls again: its admitted hit is a load error (recomputed), it re-attaches.
        plan, _, recving, invalid = b.step()
        assert invalid == {20, 21, 22} and recving == {"b1"}
        assert not plan.loads
    finally:
        a.close()
        b.close()


def test_a_killed_service_is_a_miss_then_engines_reattach(tmp_path: Path) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock").start()
    a = Engine(svc.sock, seed=1, name="A")
    try:
        turn0 = list(range(100, 113))
        finish(a, "a0", turn0, [5, 6, 7, 8], out=3, session="s")
        a.step()
        svc.kill()
        v = view("a1", tokens(turn0, 8, 200), session="s")
        t0 = time.monotonic()
        assert a.sched.num_matched_tokens(v, 0) == (0, False)  # a miss, no exception
        assert time.monotonic() - t0 < 3
        plan, _, _, _ = a.step()
        assert plan.is_empty()
        svc.start()  # recovers the SSD segment A wrote
        deadline = time.monotonic() + 40
        got = (0, False)
        while time.monotonic() < deadline and got[0] == 0:
            got = a.sched.num_matched_tokens(view("a2", tokens(turn0, 8, 200),
                                                  session="s"), 0)
            time.sleep(0.2)
        assert got == (12, True)
    finally:
        a.close()
        assert svc.stop() == 0, svc.stderr()


def test_an_embedded_store_cannot_open_a_served_root(node: Service) -> None:
    from flatcake.store import FlatCakeStore
    from tests.store.helpers import SMALL, small_config

    with pytest.raises(ValueError, match="already open"):
        FlatCakeStore.open(node.root, SMALL, small_config())


def test_an_idle_engine_whose_lease_ended_attaches_again_at_once(node: Service) -> None:
    a = Engine(node.sock, seed=1, name="A")
    try:
        turn0 = list(range(100, 113))
        finish(a, "a0", turn0, [5, 6, 7, 8], out=3, session="s")
        a.step()
        old = a.sched.engine_id
        deadline = time.monotonic() + 15
        while old in status(node)["engines"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert old not in status(node)["engines"]
        # Its next lookup is a hit, not a miss: it attached again within the call.
        v = view("a1", tokens(turn0, 8, 200), session="s")
        assert a.sched.num_matched_tokens(v, 0) == (12, True)
        assert a.sched.engine_id not in ("", old)
    finally:
        a.close()


def test_a_session_another_engine_wrote_is_reclaimed_on_disk_too(tmp_path: Path) -> None:
    """Engine A writes sessions; engine B's writes push the SSD over its watermark:
    the books drop A's oldest session and B's worker deletes A's file (never opened by
    B), so the disk holds what the books hold, and a service restart resurrects nothing."""
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "store.ssd_capacity_bytes=49152").start()
    a, b = Engine(svc.sock, seed=1, name="A"), Engine(svc.sock, seed=2, name="B")
    try:
        for i in range(2):
            finish(a, f"a{i}", list(range(100 * (i + 1), 100 * (i + 1) + 13)), [5, 6, 7, 8],
                   out=3, session=f"s{i}")
            a.step()
        assert len(list((svc.root / "sessions").iterdir())) == 2
        for i in range(2, 4):
            finish(b, f"b{i}", list(range(100 * (i + 1), 100 * (i + 1) + 13)),
                   [9, 10, 11, 12], out=3, session=f"s{i}")
            b.step()
            b.step()  # the drop rides the step after the reclaim
        on_disk = len(list((svc.root / "sessions").iterdir()))
        held = status(svc)["sessions"]
        assert on_disk == held < 4
    finally:
        a.close()
        b.close()
        assert svc.stop() == 0, svc.stderr()


def test_socket_and_arena_are_private_and_a_second_service_is_refused(node: Service,
                                                                       tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    a = Engine(node.sock, seed=1, name="A")  # the arena exists once an engine attached
    try:
        assert os.stat(node.sock).st_mode & 0o777 == 0o600
        (arena,) = list(node.arena_dir.iterdir())
        assert os.stat(arena).st_mode & 0o777 == 0o600
    finally:
        a.close()
    serve = [sys.executable, "-m", "flatcake.cli", "serve"]
    same_root = subprocess.run([*serve, "--root", str(node.root), "--socket",
                                str(tmp_path / "other.sock")],
                               capture_output=True, text=True, timeout=60)
    assert same_root.returncode == 2 and "already open" in same_root.stdout
    same_socket = subprocess.run([*serve, "--root", str(tmp_path / "root2"), "--socket",
                                  str(node.sock)], capture_output=True, text=True, timeout=60)
    assert same_socket.returncode == 2 and "another node service" in same_socket.stdout
    (tmp_path / "file").write_text("x")
    not_dir = subprocess.run([*serve, "--root", str(tmp_path / "file")],
                             capture_output=True, text=True, timeout=60)
    assert not_dir.returncode == 2 and "Traceback" not in not_dir.stdout + not_dir.stderr


def test_an_engine_killed_mid_write_is_rolled_back_after_its_lease(tmp_path: Path) -> None:
    """Engine A's worker wrote a turn but A stopped before reporting it durable (its
    process still there: it may only be paused): the turn is never published; after A's
    lease the write is fenced (its range held, nothing waits for it), B misses it and
    stores it itself; once A's worker reports the write, the range is freed, and fsck
    finds the root clean once the service stopped."""
    import subprocess
    import sys

    from tests.connectors.sides_harness import G

    # A lease long enough for A's write to finish before it ends on a loaded machine.
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "store.node_lease_s=8").start()
    a, b = Engine(svc.sock, seed=1, name="A"), Engine(svc.sock, seed=2, name="B")
    try:
        turn0 = list(range(100, 113))
        v = view("a0", turn0, out=3, computed=13, session="s")
        a.sched.num_matched_tokens(v, 0)
        end(a, v, [5, 6, 7, 8])
        plan = a.sched.build_step()  # the write goes to A's worker ...
        assert plan.stores
        a.worker.start_step(plan)
        for layer in range(G.num_layers):
            a.worker.wait_for_layer(layer)
        a.worker.end_step()
        # ... which writes it (its writer thread drained), and A dies before it reports.
        dropped, stopped = a.worker._writer_thread.drain(30)
        assert (dropped, stopped) == ([], True)
        books = status(svc)
        assert (books["stores_in_flight"], books["pinned_sessions"]) == (1, 1), books
        v1 = view("b1", tokens(turn0, 8, 200), session="s")
        # Never served unpublished: B waits for the store in flight (vLLM asks again).
        assert b.sched.num_matched_tokens(v1, 0) == (None, False)
        t0 = time.monotonic()
        while a.sched.engine_id in status(svc)["engines"] and time.monotonic() < t0 + 30:
            b.step()  # B keeps calling: only A's lease ends
            time.sleep(0.2)
        books = status(svc)
        assert a.sched.engine_id not in books["engines"]
        fenced = ("stores_in_flight", "pinned_sessions", "fenced_stores")
        assert tuple(books[k] for k in fenced) == (1, 1, 1), books
        assert b.sched.num_matched_tokens(view("b2", turn0, session="s"), 0) == (0, False)
        p = finish(b, "b3", turn0, [9, 10, 11, 12], out=3, session="s")
        assert p["stored_blocks"] == 3
        b.step()
        hit, _ = b.sched.num_matched_tokens(view("b4", tokens(turn0, 8, 200), session="s"), 0)
        assert hit == 12
        a.step()  # A resumes: its worker reports the write, its range is freed
        books = status(svc)
        assert tuple(books[k] for k in fenced) == (0, 0, 0), books
    finally:
        a.close()
        b.close()
        assert svc.stop() == 0, svc.stderr()
    fsck = subprocess.run([sys.executable, "-m", "flatcake.cli", "fsck", str(svc.root)],
                          capture_output=True, text=True, timeout=120)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
