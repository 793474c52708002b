"""Releasing superseded window rows under the node service: the service's books decide,
and each tensor-parallel rank punches its own part's file (split heads: ``ROOT/tp0``,
``ROOT/tp1``), so every part's sliding layer holds the newest window only, and an
engine attached later still restores every block of the newest turn on every rank."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flatcake.cio.filescan import scan_session_file
from flatcake.layout import ALIGN, align_up
from flatcake.link.wire import TensorRanks
from tests.connectors.test_window_release import GW, PER_TURN, ROW, SLOTS, WINDOW, run_turn
from tests.service.helpers import Service, TensorEngine

pytest.importorskip("zmq")


def test_every_rank_punches_its_part_and_the_newest_turn_restores(tmp_path: Path) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "placement.short_reply_threshold_tokens=0").start()
    try:
        e = TensorEngine(svc.sock, TensorRanks(2), g=GW)
        turns = 4
        for t in range(turns):
            run_turn(e, t)
        want = {(rank, layer, b): e.rank_block(rank, layer, SLOTS[b])
                for rank in range(2) for layer in range(3)
                for b in range(turns * PER_TURN)
                if layer < 2 or b >= turns * PER_TURN - WINDOW}
        e.close()
        # Another engine, turn 4: every block of the newest turn, byte for byte per
        # rank. Its store step hands over turn 2's release (its restore read turn 2's
        # full rows until then); turn 3's waits for the next step that calls.
        e2 = TensorEngine(svc.sock, TensorRanks(2), seed=30, g=GW)
        run_turn(e2, turns)
        for (rank, layer, b), raw in want.items():
            assert e2.rank_block(rank, layer, SLOTS[b]) == raw, (rank, layer, b)
        e2.close()
        for part in ("tp0", "tp1"):
            (path,) = sorted((tmp_path / "root" / part / "sessions").iterdir())
            _, segs, damaged = scan_session_file(path)  # the holes, as a restart reads
            assert not damaged
            assert [s.released for s in segs] == [(2,)] * (turns - 1) + [(), ()], part
            full = align_up(segs[0].layout.header_bytes + PER_TURN * 2 * ROW)
            allocated = os.stat(path).st_blocks * 512
            assert allocated <= ALIGN + (turns + 1) * (full + ALIGN) + 2 * WINDOW * ROW, part
    finally:
        assert svc.stop() == 0, svc.stderr()
