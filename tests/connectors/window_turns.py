"""The window-release tests' model and turns: a three-layer geometry with a sliding group,
the prompts of a growing session sent to SSD, and what its session file holds."""

from __future__ import annotations

from pathlib import Path

from flatcake.cio.files import SESSIONS_DIR
from flatcake.connectors.scheduler_side import RequestView
from flatcake.geometry import KVGeometry, LayerGroup
from tests.cio.helpers import window_pages_held
from tests.connectors.sides_harness import Harness, end, settings, view

GW = KVGeometry(num_layers=3, tokens_per_block=4, num_kv_heads=2, head_dim=64,
                dtype="float32", name="tiny",
                groups=(LayerGroup(2, 1024, kind="full"),
                        LayerGroup(1, 1024, window_tokens=8, kind="sliding")))
WINDOW, PER_TURN, ROW = 2, 5, 4096
SLOTS = list(range(40))
SSD = ("placement.short_reply_threshold_tokens=0",)  # every turn to SSD
# Superseded rows released as soon as a newer turn is durable (the punch machinery these
# tests follow); by default they wait until the SSD needs the space.
TO_SSD = settings(*SSD, "store.release_windows_at_once=true")


def prompt(turn: int) -> list[int]:
    """Turn ``turn``'s prompt: ``PER_TURN`` more full blocks each turn, plus one token."""
    return list(range(1000, 1000 + 4 * PER_TURN * (turn + 1) + 1))


def run_turn(h: Harness, turn: int) -> None:
    """Turn ``turn`` of session ``s``: its hit (every block of the turn before) is
    restored, then its new blocks are stored; a step more hands over the releases."""
    toks = prompt(turn)
    rid = f"t{turn}"
    v = view(rid, toks, session="s")
    matched, _ = h.sched.num_matched_tokens(v, 0)
    assert matched == 4 * PER_TURN * turn
    if matched:
        h.sched.after_alloc(rid, SLOTS[:len(toks) // 4 + 1], matched)
        _, _, recving, invalid = h.step()
        assert recving == {rid} and not invalid
    end(h, RequestView(rid, v.keys, len(toks), len(toks), 0, len(toks), "s"), SLOTS)
    plan, sending, _, _ = h.step()
    assert len(plan.stores) == 1 and sending == {rid}


def the_file(root: Path) -> Path:
    (path,) = sorted((root / SESSIONS_DIR).iterdir())
    return path


def sliding_bytes_on_disk(h: Harness, path: Path) -> int:
    """Bytes of the sliding layer's whole pages that hold data (``SEEK_DATA``)."""
    return window_pages_held(path, ((int(s.file_offset or 0), s.layout)
                                    for s in h.sched.control.segments()), WINDOW)


def released_layers(h: Harness) -> list[tuple[int, ...]]:
    return [s.layout.released for s in sorted(h.sched.control.segments(),
                                               key=lambda s: s.file_offset or 0)]
