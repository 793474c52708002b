"""Asynchronous restores (per-layer signals, waiting for a staging window in FC-MAS's
SSD queue, started by its priority, never cancelled) and reclaim as seen on disk
(whole sessions, oldest first, files deleted, budget held)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from flatcake.cio.files import SESSIONS_DIR
from flatcake.cio.staging import StagingWindow
from flatcake.clock import ManualClock
from flatcake.store import FlatCakeStore
from tests.store.helpers import (
    SMALL,
    TO_MEMORY,
    TO_SSD,
    block_bytes,
    empty_kv,
    random_kv,
    session_keys,
    small_config,
)


def _same(dst: list[torch.Tensor], src: list[torch.Tensor], n: int) -> bool:
    return all(block_bytes(dst, layer, i, "kv_blocks") == block_bytes(src, layer, i,
                                                                        "kv_blocks")
               for layer in range(SMALL.num_layers) for i in range(n))


def test_start_load_signals_every_layer_then_the_result(tmp_path: Path) -> None:
    src = random_kv(SMALL, 10)
    keys = session_keys(1, 10)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        store.store_turn("s", keys, src, range(10), TO_SSD)
        dst = empty_kv(SMALL, 10)
        handle = store.start_load(keys, dst, range(10))
        assert handle.num_hit_blocks == 10 and handle.num_layers == SMALL.num_layers
        for layer in range(SMALL.num_layers):
            assert handle.wait_for_layer(layer, timeout=10)
        result = handle.wait(timeout=10)
        assert handle.done() and result.num_blocks == 10
        assert _same(dst, src, 10)
        # A miss completes at once, every layer signalled.
        miss = store.start_load(session_keys(2, 3), empty_kv(SMALL, 3), range(3))
        assert miss.wait_for_layer(SMALL.num_layers - 1, timeout=10)
        assert miss.wait(timeout=10).num_blocks == 0


@pytest.mark.parametrize("windows", [1, 2])
def test_restores_beyond_the_windows_wait_and_all_complete(tmp_path: Path, windows: int,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    active, peak = 0, 0
    lock = threading.Lock()
    real_run = StagingWindow.run

    def counting_run(self, job, ready):  # type: ignore[no-untyped-def]
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        try:
            time.sleep(0.05)  # hold the window long enough for others to queue
            return real_run(self, job, ready)
        finally:
            with lock:
                active -= 1

    monkeypatch.setattr(StagingWindow, "run", counting_run)
    src = random_kv(SMALL, 8)
    cfg = small_config(f"scheduler.max_restores_in_flight={windows}")
    with FlatCakeStore.open(tmp_path, SMALL, cfg) as store:
        all_keys = [session_keys(10 + s, 8) for s in range(6)]
        for s, keys in enumerate(all_keys):
            store.store_turn(f"s{s}", keys, src, range(8), TO_SSD)
        dsts = [empty_kv(SMALL, 8) for _ in all_keys]
        handles = [store.start_load(k, d, range(8)) for k, d in zip(all_keys, dsts,
                                                                     strict=True)]
        results = [h.wait(timeout=30) for h in handles]
    assert peak == windows
    assert [r.num_blocks for r in results] == [8] * 6  # none cancelled
    assert all(_same(d, src, 8) for d in dsts)


def test_restores_waiting_for_the_window_start_in_fc_mas_priority_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One window, held by a first restore; a big and then a small restore wait for it.
    # After both waited the same time, FC-MAS (1 + wait / kv bytes) starts the small
    # one first, where a FIFO would start the big one.
    gate = threading.Event()
    order: list[int] = []
    real_run = StagingWindow.run

    def gated_run(self, job, ready):  # type: ignore[no-untyped-def]
        order.append(job.num_request_blocks)
        if len(order) == 1:
            gate.wait(30)
        return real_run(self, job, ready)

    monkeypatch.setattr(StagingWindow, "run", gated_run)
    clock = ManualClock()
    src = random_kv(SMALL, 8)
    cfg = small_config("scheduler.max_restores_in_flight=1")
    with FlatCakeStore.open(tmp_path, SMALL, cfg, clock=clock) as store:
        keys = {n: session_keys(30 + n, n) for n in (2, 8, 4)}
        for n, k in keys.items():
            store.store_turn(f"s{n}", k, src, range(n), TO_SSD)
        dsts = {n: empty_kv(SMALL, 8) for n in keys}
        first = store.start_load(keys[2], dsts[2], range(2))
        deadline = time.monotonic() + 30
        while not order and time.monotonic() < deadline:
            time.sleep(0.01)
        big = store.start_load(keys[8], dsts[8], range(8))
        small = store.start_load(keys[4], dsts[4], range(4))
        clock.advance(1.0)
        gate.set()
        results = [h.wait(timeout=30).num_blocks for h in (first, big, small)]
        stats = store.control.restore_stats()
    assert order == [2, 4, 8]
    assert results == [2, 8, 4]
    assert (stats.num_restores_started, stats.num_restores_done) == (3, 3)
    assert stats.num_slot_waits == 2
    assert all(_same(dsts[n], src, n) for n in keys)


def test_memory_hits_go_through_the_ready_queue(tmp_path: Path) -> None:
    src = random_kv(SMALL, 4)
    keys = session_keys(40, 4)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        store.store_turn("m", keys, src, range(4), TO_MEMORY)
        dst = empty_kv(SMALL, 4)
        assert store.load(keys, dst, range(4)).num_memory_blocks == 4
        stats = store.control.restore_stats()
        assert (stats.num_submitted, stats.num_memory_only,
                stats.num_restores_started) == (1, 1, 0)
    assert _same(dst, src, 4)


def test_concurrent_writers_and_readers(tmp_path: Path) -> None:
    src = random_kv(SMALL, 12)
    errors: list[BaseException] = []
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        def session(s: int) -> None:
            try:
                keys = session_keys(50 + s, 12)
                for done in (4, 8, 12):
                    store.store_turn(f"s{s}", keys[:done], src, range(done), TO_SSD)
                    dst = empty_kv(SMALL, 12)
                    assert store.load(keys, dst, range(12)).num_blocks == done
                    assert _same(dst, src, done)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=session, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        store.control.check_integrity()
    assert errors == []


def test_reclaim_drops_oldest_sessions_and_deletes_their_files(tmp_path: Path) -> None:
    # Each session: one 20-block segment (4 KiB header + 15 KiB data) + a 4 KiB file
    # header = 24 KiB; a 256 KiB budget holds ~9 sessions under the 90% watermark.
    clock = ManualClock()
    cfg = small_config("store.ssd_capacity_bytes=262144", "store.session_file_bytes=65536")
    src = random_kv(SMALL, 20)
    all_keys = [session_keys(200 + s, 20) for s in range(25)]
    with FlatCakeStore.open(tmp_path, SMALL, cfg, clock=clock) as store:
        for s, keys in enumerate(all_keys):
            clock.advance(1.0)
            store.store_turn(f"s{s}", keys, src, range(20), TO_SSD)
            media = store.inspect()["media"]["ssd"]
            assert media["used_bytes"] <= media["capacity_bytes"]
            on_disk = len(list((tmp_path / SESSIONS_DIR).iterdir()))
            assert on_disk == media["files"]  # every reclaimed file is gone from disk
        alive = [s for s, keys in enumerate(all_keys) if store.lookup(keys).num_blocks]
        # Whole sessions, oldest first: the survivors are exactly the newest ones.
        assert alive == list(range(25 - len(alive), 25)) and 5 <= len(alive) < 12
        dst = empty_kv(SMALL, 20)
        assert store.load(all_keys[-1], dst, range(20)).num_blocks == 20
        assert _same(dst, src, 20)
        assert store.reclaim().sessions == ()  # under the high watermark now
        dropped = store.drop_session("s24")
        assert dropped.files_deleted == 1 and store.lookup(all_keys[-1]).num_blocks == 0
        store.control.check_integrity()
