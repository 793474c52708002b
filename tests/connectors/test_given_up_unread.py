"""A load given up at its deadline before its restore thread even started reading (a
loaded machine ran that thread late) is handled as one given up while it reads: its
blocks are load errors, counted late once, nothing of it reaches the KV slots, it
reads nothing once it runs, and its staging window comes back for the next load."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cio.helpers import HeldRestores, ReadOverlap
from tests.connectors.sides_harness import Harness, settings, stored_turn, tokens, view


@pytest.mark.parametrize("in_step", [True, False], ids=["in-step", "async"])
def test_a_load_given_up_before_it_reads_is_a_clean_miss(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_step: bool) -> None:
    h = Harness(tmp_path, settings("scheduler.max_restores_in_flight=1"))
    h.sched.ssd_in_step = in_step
    turn0 = stored_turn(h)
    want = {(layer, j): h.block(layer, s) for layer in range(3)
            for j, s in enumerate([1, 2, 3, 4])}
    h.worker.load_timeout_s = h.worker.async_load_timeout_s = 0.3
    held = HeldRestores(monkeypatch)
    reads = ReadOverlap(monkeypatch, hold_s=0.0)
    slots = list(range(20, 27))
    try:
        v = view("b", tokens(turn0[:16], 8, 300), session="s")
        assert h.sched.num_matched_tokens(v, 0) == (16, not in_step)
        h.sched.after_alloc("b", slots, 16)
        # Its restore thread waits until released: the deadline passes first.
        _, _, recving, invalid = h.step(lambda: held.started.wait(20))
        assert recving == (set() if in_step else {"b"}) and invalid == set(slots[:4])
        assert h.sched.totals()["loads_late"] == 1 and h.worker.late_reads() == 1
        recomputed = h.recompute(slots[:4])  # the engine recomputes those blocks
    finally:
        held.release()
    h.wait_late_reads()
    assert h.worker.late_reads() == 0 and reads.reads == 0  # it stopped before reading
    _, _, recving, invalid = h.step()  # its poll tells the books the late load ended
    assert recving == set() and invalid == set()  # reported once, never again
    assert h.sched.totals()["loads_late"] == 1
    for (layer, s), raw in recomputed.items():  # nothing of it reached the slots
        assert h.block(layer, s) == raw
    # The same hit loads, through the one window the given-up load gave back.
    h.worker.load_timeout_s = h.worker.async_load_timeout_s = 60.0
    v = view("e", tokens(turn0[:16], 8, 700), session="s")
    assert h.sched.num_matched_tokens(v, 0) == (16, not in_step)
    h.sched.after_alloc("e", list(range(40, 47)), 16)
    _, _, recving, invalid = h.step()
    assert recving == (set() if in_step else {"e"}) and invalid == set()
    assert h.sched.totals()["loaded_tokens_ssd"] == 16 and reads.reads > 0
    for (layer, j), raw in want.items():
        assert h.block(layer, 40 + j) == raw
    h.close()
