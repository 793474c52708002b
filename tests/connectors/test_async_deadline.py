"""An async load (an SSD hit on a GPU engine, a hit on other nodes) the disk does not
deliver by ``async_load_timeout_s`` is given up: its request is reported done with its
blocks as load errors (recomputed, not held as long as the disk hangs), and its late
bytes never reach the KV slots."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from flatcake.geometry import KVGeometry
from tests.cio.helpers import HungDisk
from tests.connectors.sides_harness import G4K, G, Harness, settings, stored_turn, tokens, view


@pytest.mark.parametrize("g", [G, G4K], ids=["staged", "zero-copy-able"])
def test_a_hung_async_load_is_given_up_at_its_deadline_and_fenced_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        g: KVGeometry) -> None:
    h = Harness(tmp_path, settings("scheduler.max_restores_in_flight=1"), g=g)
    turn0 = stored_turn(h)
    want = {(layer, j): h.block(layer, s) for layer in range(3)
            for j, s in enumerate([1, 2, 3, 4])}
    h.worker.async_load_timeout_s = 0.3
    disk = HungDisk(monkeypatch)
    slots = list(range(20, 27))
    try:
        v = view("b", tokens(turn0[:16], 8, 300), session="s")
        assert h.sched.num_matched_tokens(v, 0) == (16, True)  # async: the request waits
        h.sched.after_alloc("b", slots, 16)
        with caplog.at_level(logging.WARNING, "flatcake.connectors.worker_side"):
            # No poll before its read hangs: the deadline gives up a load that reads.
            plan, _, recving, invalid = h.step(lambda: disk.entered.wait(20))
        assert [t.sync for t in plan.loads] == [False] and disk.entered.is_set()
        # Done, not held (its read still hangs): its blocks are recomputed by the engine.
        assert recving == {"b"} and invalid == set(slots[:4]) and disk.late_reads == 0
        assert caplog.text.count("async_load_timeout_s") == 1
        assert h.sched.totals()["loads_late"] == 1
        assert h.worker.late_reads() == 1
        recomputed = h.recompute(slots[:4])
    finally:
        disk.release()
    h.wait_late_reads()
    assert h.worker.late_reads() == 0 and disk.late_reads > 0
    _, _, recving, invalid = h.step()  # its poll tells the books the late reads ended
    assert recving == set() and invalid == set()  # reported once, never again
    for (layer, s), raw in recomputed.items():  # the late reads never reached the slots
        assert h.block(layer, s) == raw
    # The disk answers again: the same hit loads, through the window given back.
    h.worker.async_load_timeout_s = 60.0
    v = view("e", tokens(turn0[:16], 8, 700), session="s")
    assert h.sched.num_matched_tokens(v, 0) == (16, True)
    h.sched.after_alloc("e", list(range(40, 47)), 16)
    _, _, recving, invalid = h.step()
    assert recving == {"e"} and invalid == set()
    for (layer, j), raw in want.items():
        assert h.block(layer, 40 + j) == raw
    h.close()


def test_an_async_load_within_its_deadline_is_not_given_up(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    turn0 = stored_turn(h)
    h.worker.async_load_timeout_s = 30.0
    v = view("b", tokens(turn0[:16], 8, 300), session="s")
    assert h.sched.num_matched_tokens(v, 0) == (16, True)
    h.sched.after_alloc("b", list(range(20, 27)), 16)
    _, _, recving, invalid = h.step()
    assert recving == {"b"} and invalid == set()
    assert h.sched.totals().get("loads_late", 0) == 0 and h.worker.late_reads() == 0
    h.close()


def test_the_async_deadline_is_a_setting() -> None:
    from flatcake.connectors.settings import parse_extra_config

    assert parse_extra_config({}, env={}).engine.async_load_timeout_s == 60.0
    assert parse_extra_config({"async_load_timeout_s": 5},
                              env={}).engine.async_load_timeout_s == 5
    for bad in (0, -1, float("inf"), "five", True):
        with pytest.raises(ValueError, match=r"invalid config engine\.async_load_timeout_s="):
            parse_extra_config({"async_load_timeout_s": bad}, env={})
