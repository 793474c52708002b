"""Releasing superseded window rows through the connector's two halves: the scheduler
half's books decide (``StepPlan.releases``), the worker half, which owns the files,
punches them out. On a real file, a session's sliding-layer bytes stay within its window
as it grows, a restore planned before a release reads the rows first, a fresh process
rebuilds the same books from the holes and still restores every full block of the
newest turn, and releases a crash left unpunched are punched at its first step. The
SSD budget counts what the file still holds, before and after a restart."""

from __future__ import annotations

import os
import time
from pathlib import Path

from flatcake.connectors.scheduler_side import RequestView
from flatcake.layout import ALIGN, align_up
from tests.connectors.sides_harness import Harness, end, settings, view

# Two full-attention layers and one sliding-window layer of 8 tokens (2 blocks), 4 KiB
# a block each: every window row is whole pages, so a release gives them all back.
from tests.connectors.window_turns import (
    GW,
    PER_TURN,
    ROW,
    SLOTS,
    SSD,
    TO_SSD,
    WINDOW,
    prompt,
    released_layers,
    run_turn,
    sliding_bytes_on_disk,
    the_file,
)


def test_the_worker_punches_what_the_books_release_and_a_restart_keeps_it(
        tmp_path: Path) -> None:
    h = Harness(tmp_path, s=TO_SSD, g=GW)
    turns = 6
    for t in range(turns):
        run_turn(h, t)
        h.step()  # the releases of turn t's publish
        path = the_file(tmp_path)
        assert sliding_bytes_on_disk(h, path) <= WINDOW * ROW  # the newest window only
        seg = next(iter(h.sched.control.segments()))
        full = align_up(seg.layout.header_bytes + PER_TURN * 2 * ROW)
        # The whole file (st_blocks): each turn's header and full layers, the newest
        # window, and at most a page per turn the filesystem may round up.
        assert os.stat(path).st_blocks * 512 <= ALIGN + (t + 1) * (full + ALIGN) + WINDOW * ROW
    before = released_layers(h)
    assert before == [(2,)] * (turns - 1) + [()]
    # The SSD budget counts what the file holds: the released rows no longer.
    used = h.sched.control.stats().ssd_used_bytes
    assert used == ALIGN + sum(s.total_bytes for s in h.sched.control.segments()) \
        - (turns - 1) * WINDOW * ROW
    h.sched.control.check_integrity()
    want = {(layer, b): h.block(layer, SLOTS[b]) for layer in range(3)
            for b in range(turns * PER_TURN) if layer < 2 or b >= turns * PER_TURN - WINDOW}
    h.close()
    # A fresh process: the holes are the record (the same books), and the next turn
    # gets every full block of the newest turn back, byte for byte.
    h2 = Harness(tmp_path, s=TO_SSD, g=GW, seed=1)
    assert released_layers(h2) == before
    assert h2.sched.control.stats().ssd_used_bytes == used  # the holes, counted again
    h2.sched.control.check_integrity()
    toks = prompt(turns)
    v = view("next", toks, session="s")
    assert h2.sched.num_matched_tokens(v, 0) == (4 * PER_TURN * turns, True)
    h2.sched.after_alloc("next", SLOTS[:len(toks) // 4 + 1], 4 * PER_TURN * turns)
    plan, _, recving, invalid = h2.step()
    assert not plan.releases and recving == {"next"} and not invalid
    for (layer, b), raw in want.items():
        assert h2.block(layer, SLOTS[b]) == raw, (layer, b)
    h2.close()


def test_a_restore_planned_before_a_release_reads_the_rows_first(tmp_path: Path) -> None:
    h = Harness(tmp_path, s=TO_SSD, g=GW)
    run_turn(h, 0)
    want = [h.block(2, SLOTS[b]) for b in range(PER_TURN - WINDOW, PER_TURN)]
    # Turn 1's store goes to the worker; before it is durable, a request that ends
    # at turn 0 plans its restore (turn 0's window rows).
    toks = prompt(1)
    v = view("t1", toks, session="s")
    assert h.sched.num_matched_tokens(v, 0)[0] == 4 * PER_TURN
    h.sched.after_alloc("t1", SLOTS[:len(toks) // 4 + 1], 4 * PER_TURN)
    h.step()
    end(h, RequestView("t1", v.keys, len(toks), len(toks), 0, len(toks), "s"), SLOTS)
    plan = h.sched.build_step()
    h.worker.start_step(plan)
    h.worker.end_step()
    branch = view("b", [*prompt(0)[:-1], 7, 7, 7, 7, 7], session="s")
    assert h.sched.num_matched_tokens(branch, 0)[0] == 4 * PER_TURN
    h.sched.after_alloc("b", SLOTS[20:27], 4 * PER_TURN)
    while h.worker.pending():  # turn 1 durable: turn 0's window is released
        h._report(set())
        time.sleep(0.01)
    h.reports = []
    plan, _, recving, invalid = h.step()
    # The restore in flight reads turn 0's window: it is not punched in its step ...
    assert [t.request_id for t in plan.loads] == ["b"] and not plan.releases
    assert recving == {"b"} and not invalid
    assert [h.block(2, SLOTS[20 + b]) for b in range(PER_TURN - WINDOW, PER_TURN)] == want
    plan, _, _, _ = h.step()
    assert len(plan.releases) == 1  # ... but once the restore is done
    assert released_layers(h) == [(2,), ()]
    h.close()


def test_releases_a_crash_left_unpunched_are_punched_at_the_first_step(
        tmp_path: Path) -> None:
    h = Harness(tmp_path, s=TO_SSD, g=GW)
    for t in range(3):
        run_turn(h, t)
    path = the_file(tmp_path)
    # Turn 0's window went with turn 2's first step; turn 1's was never handed over.
    assert sliding_bytes_on_disk(h, path) == 2 * WINDOW * ROW
    h.close()
    h2 = Harness(tmp_path, s=TO_SSD, g=GW, seed=1)
    plan, _, _, _ = h2.step()
    assert len(plan.releases) == 1  # turn 1's, released again by the books
    assert sliding_bytes_on_disk(h2, path) == WINDOW * ROW
    assert released_layers(h2) == [(2,), (2,), ()]
    h2.close()


def test_release_old_windows_off_keeps_every_window(tmp_path: Path) -> None:
    h = Harness(tmp_path, s=settings(*SSD, "store.release_old_windows=false"), g=GW)
    for t in range(3):
        run_turn(h, t)
        h.step()
    assert sliding_bytes_on_disk(h, the_file(tmp_path)) == 3 * WINDOW * ROW
    assert released_layers(h) == [(), (), ()]
    h.close()


def test_the_event_stream_says_when_a_turns_blocks_stop_ending_a_hit(tmp_path: Path) -> None:
    # The books release turn 0's sliding rows when turn 1 is published: a hit ending in
    # turn 0's blocks is cut back from then on, so the stream says those blocks lost
    # their sliding layer (layer 2), once, and keeps advertising the rest.
    h = Harness(tmp_path, s=TO_SSD, g=GW)
    run_turn(h, 0)
    first = next(iter(h.sched.control.segments()))
    assert [e.stored for e in h.sched.take_events()] == [True]
    run_turn(h, 1)
    h.step()
    events = [(e.stored, e.keys, e.layers) for e in h.sched.take_events()]
    assert (False, first.keys, (2,)) in events
    assert [e for e in events if not e[0]] == [(False, first.keys, (2,))]
    assert h.sched.control.lookup(first.keys).num_blocks == 0  # what the event says
    h.step()
    assert [e for e in h.sched.take_events() if not e.stored] == []  # said once
    h.close()


def test_releases_an_engine_stopped_before_punching_are_punched_by_the_next(
        tmp_path: Path) -> None:
    # Two engines on one node's books (as under the node service): the first hands a
    # release to its workers and stops before they start that step (its lease ends).
    # The next engine's step hands it out again, so the rows leave the file now, not
    # at the next start, and the SSD budget counts what the file holds.
    from flatcake.connectors.scheduler_side import NodeParts, SchedulerSide

    h = Harness(tmp_path, s=TO_SSD, g=GW)
    run_turn(h, 0)
    run_turn(h, 1)
    lost = h.sched.build_step()  # its workers never start it
    assert lost.releases
    h.sched.abandon()
    node = NodeParts(h.sched.control, h.sched.sessions, h.sched.refcount, 0)
    other = SchedulerSide(GW, TO_SSD, tmp_path, node=node, queue="e2")
    plan = other.build_step()
    assert plan.releases == lost.releases
    h.worker.start_step(plan)  # the next engine's workers share the files
    h.worker.end_step()
    path = the_file(tmp_path)
    assert sliding_bytes_on_disk(h, path) <= WINDOW * ROW
    used = h.sched.control.stats().ssd_used_bytes
    assert used == ALIGN + sum(s.total_bytes for s in h.sched.control.segments()) - WINDOW * ROW
    assert other.build_step().releases == ()  # once
    h.close()
