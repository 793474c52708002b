"""A call its client gave up on is never run late, or is undone (issue 40: a
``prepare_store`` the client timed out on ran once the service resumed, leaving a store
in flight and a pin that never ended: ``drop_session`` then refused, "pinned by 1
restores or writes in flight")."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from flatcake.link import verbs, wire
from flatcake.link.frames import Connection
from flatcake.store import FlatCakeStore
from tests.service.helpers import Service, pause
from tests.store.helpers import SMALL, TO_SSD, random_kv, session_keys, small_config


def start(tmp_path: Path) -> tuple[Service, FlatCakeStore]:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "store.memory_capacity_bytes=4194304",
                  "store.ssd_capacity_bytes=268435456").start()
    cfg = small_config(f"store.node=unix:{svc.sock}", "store.node_timeout_s=1")
    return svc, FlatCakeStore.open(svc.root, SMALL, cfg)


def nothing_held(store: FlatCakeStore) -> None:
    st = store.control.stats()
    assert (st.stores_in_flight, st.loads_in_flight, st.num_pinned_sessions) == (0, 0, 0)


def test_a_call_delayed_past_its_clients_timeout_leaves_no_store_nor_pin(tmp_path: Path
                                                                         ) -> None:
    svc, store = start(tmp_path)
    assert svc.proc is not None
    kv, keys = random_kv(SMALL, 8, seed=4), session_keys(4, 4)
    try:
        pause(svc.proc.pid)  # a paused service (a GC pause, SIGSTOP): the call waits
        try:
            with pytest.raises(ConnectionError, match="did not answer prepare_store"):
                store.control.prepare_store("s", keys, turn_index=0, context_tokens=0)
        finally:
            os.kill(svc.proc.pid, signal.SIGCONT)
        time.sleep(0.3)  # the service reads the late call
        nothing_held(store)
        # The session is written and dropped as if the call had never been made.
        assert store.store_turn("s", keys, kv, list(range(4)), TO_SSD).num_blocks == 4
        assert store.drop_session("s").sessions == ("s",)
        nothing_held(store)
    finally:
        store.close()
        assert svc.stop() == 0, svc.stderr()


def test_a_call_run_in_time_whose_answer_was_never_seen_is_undone(tmp_path: Path) -> None:
    # A raw connection of the store's own process stands for its client: it sends calls
    # as the store, with a deadline and the calls it gave up on, and reads the answers.
    svc, store = start(tmp_path)
    peer = Connection(str(svc.sock), 5.0)
    sid = store.control._id  # type: ignore[attr-defined]
    keys = session_keys(5, 4)
    prepare = ("prepare_store", ["s", keys, 0, 0])

    def ask(call_id: int, method: str, args: list[Any], *, late: bool = False,
            gave_up: tuple[int, ...] = ()) -> tuple[bool, Any]:
        deadline = time.time() + (-1.0 if late else 5.0)
        peer.send(wire.call_frame(call_id, sid, method, args, deadline, gave_up))
        reply = wire.decode_reply(peer.recv(time.monotonic() + 5.0))
        assert reply.call_id == call_id
        if not reply.ok:
            return False, reply.error
        return True, verbs.CONTROL[method].decode_reply(reply.value)

    try:
        # Run in time, its answer never seen: named as given up, it is rolled back.
        ok, plan = ask(1, *prepare)
        assert ok and plan is not None
        assert store.control.stats().stores_in_flight == 1
        ok, _ = ask(2, "stats", [], gave_up=(1,))
        assert ok
        nothing_held(store)
        # Given up before it was read: it never runs.
        assert ask(3, "stats", [], gave_up=(4,))[0]
        ok, why = ask(4, *prepare)
        assert not ok and wire.GAVE_UP in why
        nothing_held(store)
        # Read after its deadline: not run.
        ok, why = ask(5, *prepare, late=True)
        assert not ok and wire.GAVE_UP in why
        nothing_held(store)
        # The store writes and drops the session.
        kv = random_kv(SMALL, 8, seed=5)
        assert store.store_turn("s", keys, kv, list(range(4)), TO_SSD).num_blocks == 4
        assert store.drop_session("s").sessions == ("s",)
    finally:
        peer.close()
        store.close()
        assert svc.stop() == 0, svc.stderr()
