"""``scripts/continuation_signals.py`` (issue 44) on a hand-worked workload: recording the
stores changes nothing, each store's fate (read back from the SSD, continued) is the one
the scenario makes, and the oracle writes exactly the turn that is read back."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

from flatcake.layout import SegmentLayout
from flatcake.replay.simulate import run_replay
from flatcake.replay.workload.trace import from_sessions
from tests.replay.helpers import GEOMETRY, ids, tiny_preset

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "continuation_signals.py"
BT = GEOMETRY.tokens_per_block
# Session 0: one turn of 8 blocks, never continued. Session 1: 8 blocks, then 60 s later
# 4 more: by then session 2's turns (a new 8-block prompt every 10 s, none continued)
# have pushed its first turn out of the 64-block GPU, so it is restored from the SSD (no
# memory copies in the tiny preset). Replies of 600 tokens: neither short nor long.
SESSIONS = [[(ids(0, 8), 8 * BT, 600, 0.0)],
            [(ids(0, 8), 8 * BT, 600, 0.0), (ids(0, 12), 12 * BT, 600, 60.0)],
            [(ids(100 * k, 100 * k + 8), 8 * BT, 600, 10.0 if k else 0.0) for k in range(6)]]


@functools.cache
def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("continuation_signals", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _preset():  # type: ignore[no-untyped-def]
    preset = tiny_preset(gpu_blocks=64)
    return dataclasses.replace(preset, rates=(0.5,))


def _ssd(blocks: int) -> int:
    return SegmentLayout.for_ssd(blocks, GEOMETRY.layer_block_bytes).total_bytes


def test_the_probe_records_without_changing_the_run() -> None:
    cs, wl, preset = _script(), from_sessions(SESSIONS, BT), _preset()
    plain = run_replay(wl, "flatcake", 0.5, preset).to_dict()
    probed, rows = cs.replay(wl, preset, 0.5, None)
    for key in ("hit_rate_gpu", "ssd_write_bytes", "ssd_read_bytes", "ttft_mean_s",
                "ssd_never_read_bytes"):
        assert probed[key] == plain[key], key
    assert plain["ssd_read_bytes"] > 0  # the scenario restores from the SSD
    # One store per turn, every one on the SSD; only session 1's first turn is read
    # back, and it is the one a later prompt ran through.
    assert len(rows) == 9 and {r.medium for r in rows} == {"ssd"}
    read = [r for r in rows if r.read]
    assert [(r.signals["turn_index"], r.total_bytes) for r in read] == [(0.0, _ssd(8))]
    assert [r.idx for r in rows if r.continued] == [r.idx for r in read]


def test_the_oracle_writes_only_the_turn_read_back_and_keeps_the_hits() -> None:
    cs, wl, preset = _script(), from_sessions(SESSIONS, BT), _preset()
    res = cs.run_rate(wl, preset, 0.5, 0)
    today, oracle = res["today"], res["oracle_replayed"]
    assert res["oracle_arithmetic"]["written_gb"] == _ssd(8) / cs.GB
    assert oracle["written_gb"] == _ssd(8) / cs.GB
    assert oracle["hit_pct"] == today["hit_pct"]
    assert res["stores"] == {"ssd": 9, "read_back": 1, "continued": 1, "first_turns": 3,
                             "first_turns_read": 1, "first_turns_continued": 1}
    # today's not_yet (first turns deferred) is replayed; every signal has a row
    assert res["rules"][0]["rule"] == "write now if turn_index >= 1"
    assert {s["signal"] for s in res["signals"]} <= set(cs.SIGNALS)
    assert "| oracle, replayed |" in cs.markdown(res)


def test_auc_counts_ties_half_and_skips_unknown_values() -> None:
    auc = _script().auc
    y = np.array([True, False, True, False])
    assert auc(np.array([4.0, 1.0, 3.0, 2.0]), y) == 1.0
    assert auc(np.array([1.0, 4.0, 2.0, 3.0]), y) == 0.0
    assert auc(np.array([1.0, 1.0, 1.0, 1.0]), y) == 0.5
    assert auc(np.array([4.0, math.nan, 3.0, 2.0]), y) == 1.0
    assert math.isnan(auc(np.array([1.0, 2.0]), np.array([True, True])))


def test_all_signals_combined_score_the_second_half_with_the_first_halfs_fit() -> None:
    cs = _script()
    # Read back exactly when the reply was long: the fit finds it, whatever the rest.
    rows = [cs.Row(i, {**dict.fromkeys(cs.SIGNALS, 1.0), "gap_s": math.nan,
                       "reply_tokens": float(100 + 400 * (i % 2) + i)},
                   medium="ssd", read=bool(i % 2)) for i in range(40)]
    got, score = cs.fit_combined(rows)
    assert got == 1.0 and score is not None
    assert score(rows[1].signals) > score(rows[0].signals)
    few, none = cs.fit_combined(rows[:3])
    assert math.isnan(few) and none is None
