"""SSD loads run in the step that schedules their request (``ssd_in_step``, a CPU
engine's host-memory KV): planned sync, in the step's plan at once, their layers ready
before the forward pass reads them, and a damaged segment reported as load errors in
that same step; a load the disk does not deliver by the step's deadline is given up,
its blocks load errors, and its late bytes never reach the KV slots."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from flatcake.cio.filescan import scan_session_file
from flatcake.clock import ManualClock
from flatcake.geometry import KVGeometry
from tests.cio.helpers import HungDisk, ReadOverlap
from tests.connectors.sides_harness import (
    G4K,
    G,
    Harness,
    finish,
    settings,
    stored_turn,
    tokens,
    view,
)


def _once_hung(disk: HungDisk) -> Callable[[], object]:
    """The step's forward pass starts once its load's read hangs with the disk: the
    deadline (from the step's start) then gives up a load that is reading, however
    late a loaded machine ran its restore thread."""
    return lambda: disk.entered.wait(20)


def test_an_ssd_hit_loads_in_the_step_that_schedules_it(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.sched.ssd_in_step = True
    turn0 = stored_turn(h)
    want = {(layer, j): h.block(layer, s) for layer in range(3)
            for j, s in enumerate([1, 2, 3, 4])}
    v = view("b", tokens(turn0[:16], 8, 300), session="s")
    assert h.sched.num_matched_tokens(v, 0) == (16, False)  # the engine does not wait
    slots = list(range(20, 27))
    h.sched.after_alloc("b", slots, 16)
    assert h.sched.hit_sources("b") == (0, 16)  # every block from SSD
    plan, _, recving, invalid = h.step()
    assert [(t.request_id, t.sync) for t in plan.loads] == [("b", True)]
    assert recving == set() and invalid == set()  # nothing left to report later
    for (layer, j), raw in want.items():
        assert h.block(layer, slots[j]) == raw
    totals = h.sched.totals()
    assert totals["loaded_tokens_ssd"] == 16 and totals.get("restores_started", 0) == 0
    h.close()


def test_a_damaged_segment_loaded_in_step_is_a_load_error_of_that_step(
        tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.sched.ssd_in_step = True
    turn0 = stored_turn(h)
    (path,) = (tmp_path / "sessions").iterdir()
    _, (seg,), _ = scan_session_file(path)
    data = bytearray(path.read_bytes())
    data[seg.file_offset + seg.header.layout.data_offset + 100] ^= 0xFF  # layer 0 rots
    path.write_bytes(bytes(data))
    v = view("b", tokens(turn0[:16], 8, 300), session="s")
    assert h.sched.num_matched_tokens(v, 0) == (16, False)
    slots = list(range(20, 27))
    h.sched.after_alloc("b", slots, 16)
    _, _, recving, invalid = h.step()
    assert recving == set() and invalid == set(slots[:4])  # recomputed by the engine
    assert h.sched.totals()["damaged_segments"] == 1
    h.close()


def test_a_gpu_engine_keeps_ssd_loads_async(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    turn0 = stored_turn(h)
    v = view("b", tokens(turn0[:16], 8, 300), session="s")
    assert h.sched.num_matched_tokens(v, 0) == (16, True)
    h.sched.after_alloc("b", list(range(20, 27)), 16)
    plan, _, recving, _ = h.step()
    assert [t.sync for t in plan.loads] == [False] and recving == {"b"}
    h.close()


@pytest.mark.parametrize("g", [G, G4K], ids=["staged", "zero-copy-able"])
def test_a_hung_in_step_load_is_given_up_at_its_deadline_and_fenced_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        g: KVGeometry) -> None:
    # One staging window: a window the late restore kept for good would hang the next.
    h = Harness(tmp_path, settings("scheduler.max_restores_in_flight=1"), g=g)
    h.sched.ssd_in_step = True
    turn0 = stored_turn(h)
    want = {(layer, j): h.block(layer, s) for layer in range(3)
            for j, s in enumerate([1, 2, 3, 4])}
    h.worker.load_timeout_s = 0.3
    disk = HungDisk(monkeypatch)
    v = view("b", tokens(turn0[:16], 8, 300), session="s")
    assert h.sched.num_matched_tokens(v, 0) == (16, False)
    slots = list(range(20, 27))
    h.sched.after_alloc("b", slots, 16)
    out: list[tuple[object, set[str], set[str], set[int]]] = []
    stepper = threading.Thread(target=lambda: out.append(h.step(_once_hung(disk))))
    try:
        with caplog.at_level(logging.WARNING, "flatcake.connectors.worker_side"):
            stepper.start()
            stepper.join(20)
        assert disk.entered.is_set()
        assert not stepper.is_alive()  # the step went on without the hung load
        (_, _, recving, invalid), = out
        assert recving == set() and invalid == set(slots[:4])  # recomputed by the engine
        assert caplog.text.count("given up") == 1
        totals = h.sched.totals()
        assert totals["loads_late"] == 1 and totals.get("loaded_tokens_ssd", 0) == 0
        recomputed = h.recompute(slots[:4])  # the engine recomputes those blocks
    finally:
        disk.release()
    h.wait_late_reads()
    assert disk.late_reads > 0
    h.step()  # its poll tells the books the late reads ended
    # The disk answers again: the next step's hit loads, through the window the late
    # restore gave back once its reads ended.
    h.worker.load_timeout_s = 60.0
    v = view("e", tokens(turn0[:16], 8, 700), session="s")
    assert h.sched.num_matched_tokens(v, 0) == (16, False)
    h.sched.after_alloc("e", list(range(40, 47)), 16)
    _, _, _, invalid = h.step()
    assert invalid == set() and h.sched.totals()["loaded_tokens_ssd"] == 16
    for (layer, j), raw in want.items():
        assert h.block(layer, 40 + j) == raw
    h.close()
    assert disk.late_reads > 0
    for (layer, s), raw in recomputed.items():  # the late reads landed in the window
        assert h.block(layer, s) == raw


def test_an_in_step_load_keeps_the_stores_bound_on_reads_in_flight(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each segment layer (4 blocks of 4 KiB) is read in 4 commands; the store lets a
    # restore have one with the reader at a time, whichever step it loads in.
    h = Harness(tmp_path, settings("store.reads_in_flight=1", "planner.max_read_bytes=4096"),
                g=G4K)
    h.sched.ssd_in_step = True
    turn0 = stored_turn(h)
    overlap = ReadOverlap(monkeypatch)
    v = view("b", tokens(turn0[:16], 8, 300), session="s")
    assert h.sched.num_matched_tokens(v, 0) == (16, False)
    h.sched.after_alloc("b", list(range(20, 27)), 16)
    plan, _, _, invalid = h.step()
    assert [t.sync for t in plan.loads] == [True] and invalid == set()
    assert h.sched.totals()["loaded_tokens_ssd"] == 16
    assert overlap.reads >= 12 and overlap.most_at_once == 1
    h.close()


def test_several_in_step_loads_run_side_by_side_in_fc_mas_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two SSD hits admitted for one step, the larger first. Having waited as long,
    # FC-MAS starts the smaller first (1 + wait / kv bytes), and both restores read at
    # once (two windows), not one after the other: each has at most one read with the
    # reader at a time.
    clock = ManualClock(100.0)
    h = Harness(tmp_path, settings("store.reads_in_flight=1", "planner.max_read_bytes=4096",
                                   "scheduler.max_restores_in_flight=2"), g=G4K, clock=clock)
    h.sched.ssd_in_step = True
    h.worker.load_timeout_s = 60.0
    big = stored_turn(h)  # 4 blocks
    small = list(range(500, 509))  # 2 blocks
    assert finish(h, "c", small, [8, 9, 10], out=3, session="t")["placement"] == \
        "ssd:first_turn"
    h.step()
    overlap = ReadOverlap(monkeypatch, hold_s=0.5)
    for rid, toks, n, session in (("b", big[:16], 16, "s"), ("d", small[:8], 8, "t")):
        v = view(rid, tokens(toks, 8, 300), session=session)
        assert h.sched.num_matched_tokens(v, 0) == (n, False)
        h.sched.after_alloc(rid, list(range(20, 27)) if rid == "b" else
                            list(range(30, 35)), n)
    clock.advance(1.0)
    plan, _, _, invalid = h.step()
    assert [(t.request_id, t.sync) for t in plan.loads] == [("d", True), ("b", True)]
    assert invalid == set() and h.sched.totals()["loaded_tokens_ssd"] == 16 + 8
    assert overlap.most_at_once == 2
    h.close()


def test_while_a_given_up_load_still_reads_no_step_loads_ssd_in_the_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The disk hangs: the first step gives its SSD load up at the deadline. Until that
    # load's reads end, the same hit is planned as a miss (no later step waits the
    # deadline again); once they end, SSD hits load in the step again.
    h = Harness(tmp_path, settings("scheduler.max_restores_in_flight=1"))
    h.sched.ssd_in_step = True
    turn0 = stored_turn(h)
    h.worker.load_timeout_s = 0.3
    disk = HungDisk(monkeypatch)
    out: list[tuple[object, set[str], set[str], set[int]]] = []
    try:
        v = view("b", tokens(turn0[:16], 8, 300), session="s")
        assert h.sched.num_matched_tokens(v, 0) == (16, False)
        h.sched.after_alloc("b", list(range(20, 27)), 16)
        stepper = threading.Thread(target=lambda: out.append(h.step(_once_hung(disk))))
        stepper.start()
        stepper.join(20)
        assert not stepper.is_alive() and disk.entered.is_set()
        assert h.sched.totals()["loads_late"] == 1 and h.worker.late_reads() == 1
        v = view("c", tokens(turn0[:16], 8, 500), session="s")
        assert h.sched.num_matched_tokens(v, 0) == (0, False)  # a miss: recomputed
        assert h.sched.num_matched_tokens(v, 0) == (0, False)  # asked again: one count
        plan, _, _, invalid = h.step()
        assert plan.loads == () and invalid == set()
        assert h.sched.totals()["loads_backed_off"] == 1
    finally:
        disk.release()
    h.wait_late_reads()
    assert h.worker.late_reads() == 0
    h.step()  # its poll reports the late reads ended
    h.worker.load_timeout_s = 60.0  # the disk answers again: nothing given up
    v = view("e", tokens(turn0[:16], 8, 700), session="s")
    assert h.sched.num_matched_tokens(v, 0) == (16, False)
    h.sched.after_alloc("e", list(range(40, 47)), 16)
    plan, _, _, invalid = h.step()
    assert [(t.request_id, t.sync) for t in plan.loads] == [("e", True)] and invalid == set()
    assert h.sched.totals()["loaded_tokens_ssd"] == 16
    h.close()
