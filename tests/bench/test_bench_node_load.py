"""``flatcake bench --node-load``: attached engine clients against one ``flatcake serve``
at rising rates. Asserted: every request counted, a latency kept per call, repeats hit,
the books clean after each rate, files removed; never a timing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flatcake.bench.node_load import LoadOptions
from flatcake.cli import main


def test_load_rows_count_every_call_and_leave_the_books_clean(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("zmq")
    assert main(["bench", "--node-load", "--quick", "--dir", str(tmp_path), "--json",
                 "--p99-bound-ms", "1e9"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = doc["rows"]
    assert [r["offered"] for r in rows] == [20.0, 40.0]  # two clients, two low rates
    for r in rows:
        calls = r["calls"]
        assert r["requests"] > 0 and calls["lookup"] == r["requests"]
        # a new prompt is stored, a repeat is admitted: one or the other, every request
        assert calls["store"] > 0 and calls["admission"] > 0
        assert calls["store"] + calls["admission"] == r["requests"]
        assert all(r["p50_ms"][c] > 0 for c in calls)
        assert r["books_clean"] and r["books"]["pinned_sessions"] == 0
        assert r["books"]["stores_in_flight"] == 0 and r["books"]["loads_in_flight"] == 0
    assert rows[1]["books"]["sessions"] == sum(r["calls"]["store"] for r in rows)
    assert doc["saturation_per_s"] > 0
    assert not list(tmp_path.glob("flatcake-node-load-*"))  # cleaned up


def test_bad_load_options_are_refused(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--node-load", "--rates", "10,x", "--dir", str(tmp_path)]) == 2
    assert "--rates must be numbers" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--clients must be an int >= 1"):
        LoadOptions(str(tmp_path), clients=0)
