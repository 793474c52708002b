"""What an attached ``FlatCakeStore`` and an attached executor wait for, and how: a load
behind another store's write in flight is answered by the service once that write ends
(one held call, no polling); the servable hit is one call; a write into a file another
process is still creating waits without the executor's lock; a store the service forgot
(its idle lease ended) attaches again within its next call."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from flatcake.cio.executor import Executor
from flatcake.clock import WallClock
from flatcake.control import ControlPlane
from flatcake.layout import ALIGN
from flatcake.link.verbs import Verb
from flatcake.service.endpoint import ask_status
from flatcake.store import FlatCakeStore
from tests.service.helpers import Service
from tests.store.helpers import (
    SMALL,
    TO_SSD,
    block_bytes,
    empty_kv,
    random_kv,
    session_keys,
    small_config,
)

SLOTS = 8


@pytest.fixture
def node(tmp_path: Path):  # type: ignore[no-untyped-def]
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "store.memory_capacity_bytes=4194304",
                  "store.ssd_capacity_bytes=268435456").start()
    yield svc
    assert svc.stop() == 0, svc.stderr()


def attached(svc: Service, timeout_s: float = 5.0) -> FlatCakeStore:
    cfg = small_config(f"store.node=unix:{svc.sock}", f"store.node_timeout_s={timeout_s}")
    return FlatCakeStore.open(svc.root, SMALL, cfg)


def calls(svc: Service) -> int:
    """The service's calls so far, this status call excluded."""
    return int(ask_status(svc.sock, 5.0)["calls"]) - 1


def test_a_load_behind_a_write_in_flight_is_answered_when_the_write_ends(node: Service
                                                                        ) -> None:
    a, b = attached(node), attached(node, timeout_s=20.0)
    try:
        kv = random_kv(SMALL, SLOTS, seed=3)
        keys = session_keys(1, 6)
        slots = list(range(6))
        assert a.store_turn("s1", keys[:3], kv, slots, TO_SSD).num_blocks == 3
        # A's next turn is in flight (blocks 3..5), held in the books by A.
        plan = a.control.prepare_store("s1", keys, turn_index=1, context_tokens=0)
        assert plan is not None and plan.first_block == 3
        asked: list[str] = []
        client = b.control._client  # type: ignore[attr-defined]
        call = client.call

        def recording(verb: Verb, engine_id: str = "", *args: Any, **kw: Any) -> Any:
            asked.append(verb.name)
            return call(verb, engine_id, *args, **kw)

        client.call = recording
        ended: list[float] = []

        def write_fails() -> None:
            ended.append(time.monotonic())
            a.control.complete_store(plan, False)  # rolled back: never published

        before = calls(node)
        timer = threading.Timer(0.5, write_fails)
        timer.start()
        t0 = time.monotonic()
        got = empty_kv(SMALL, SLOTS)
        res = b.load(keys, got, slots)
        done = time.monotonic()
        timer.join()
        # B waited for A's write (not a miss of blocks 0..2 at once), was answered once
        # it ended (well before its 20 s bound), and serves what is durable.
        assert ended and ended[0] <= done < t0 + 10
        assert res.num_blocks == 3
        for layer in range(SMALL.num_layers):
            for s in range(3):
                assert block_bytes(got, layer, s, "kv_blocks") == \
                    block_bytes(kv, layer, s, "kv_blocks")
        # The servable hit is one call (asked again after the wait), never a lookup plus
        # one call per key in flight, and nothing polls the service meanwhile.
        assert asked.count("servable") == 2
        assert "lookup" not in asked and "store_in_flight" not in asked
        spent = calls(node) - before - 1  # the status call of ``before`` too
        assert spent <= len(asked) + 2, (spent, asked)  # + A's complete_store, B's wait
    finally:
        a.close()
        b.close()


def test_a_store_whose_idle_lease_ended_attaches_again_within_its_next_call(
        node: Service) -> None:
    a = attached(node)
    try:
        kv = random_kv(SMALL, SLOTS, seed=4)
        keys = session_keys(2, 3)
        assert a.store_turn("s2", keys, kv, [0, 1, 2], TO_SSD).num_blocks == 3
        (old,) = ask_status(node.sock, 5.0)["stores"]
        deadline = time.monotonic() + 15
        while old in ask_status(node.sock, 5.0)["stores"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert old not in ask_status(node.sock, 5.0)["stores"]
        # Its next call is answered (a hit, not an error): it attached again within it.
        assert a.lookup(keys).num_blocks == 3
        assert list(ask_status(node.sock, 5.0)["stores"]) not in ([], [old])
    finally:
        a.close()


def test_a_write_into_a_file_another_process_creates_waits_outside_the_lock(
        tmp_path: Path) -> None:
    cfg = small_config()
    arena = tmp_path / "arena"
    arena.touch()
    os.truncate(arena, cfg.store.memory_capacity_bytes)
    cp = ControlPlane(SMALL, cfg, WallClock())
    keys = session_keys(3, 4)
    first = cp.prepare_store("s3", keys[:2], turn_index=0, context_tokens=0)
    assert first is not None and first.new_file
    cp.complete_store(first, True)
    second = cp.prepare_store("s3", keys, turn_index=0, context_tokens=0)
    assert second is not None and not second.new_file and second.file_id == first.file_id
    # Two attached executors of one root: ``theirs`` stands for the process creating
    # the file; ``mine`` is asked to append to it first.
    mine, theirs = (Executor(tmp_path / "root", SMALL, cfg, arena_path=arena)
                    for _ in range(2))
    try:
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(mine.prepare_file, second)
            time.sleep(0.3)  # let it reach the wait
            assert not waiting.done()
            # Meanwhile the executor's lock is free: this process's loads go on.
            assert mine.lock.acquire(timeout=2.0)
            mine.lock.release()
            theirs.prepare_file(first)  # the file appears (whole)
            seq, target = waiting.result(timeout=15)
        assert target is not None and seq == int(second.file_offset or 0) // ALIGN
    finally:
        mine.close()
        theirs.close()


def test_a_hit_another_process_reclaims_before_the_pin_is_looked_up_again(node: Service
                                                                         ) -> None:
    a, b = attached(node), attached(node)
    try:
        kv = random_kv(SMALL, SLOTS, seed=5)
        keys = session_keys(4, 3)
        assert a.store_turn("s4", keys, kv, [0, 1, 2], TO_SSD).num_blocks == 3
        servable = b.control.servable  # type: ignore[attr-defined]
        asked: list[int] = []

        def then_dropped(*args: Any, **kw: Any) -> Any:
            found = servable(*args, **kw)
            if not asked:  # between B's lookup and its pin, A drops the session
                a.drop_session("s4")
            asked.append(found.hit.num_blocks)
            return found

        b.control.servable = then_dropped  # type: ignore[attr-defined]
        res = b.load(keys, empty_kv(SMALL, SLOTS), [0, 1, 2])
        # Not an error: looked up again, and what is left (nothing) is served.
        assert asked == [3, 0] and res.num_blocks == 0
    finally:
        a.close()
        b.close()
