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
        # what a request costs the machine: the service's CPU and the clients' own
        assert r["service_cpu_us"] >= 0 and r["clients_cpu_us"] > 0
        assert r["books_clean"] and r["books"]["pinned_sessions"] == 0
        assert r["books"]["stores_in_flight"] == 0 and r["books"]["loads_in_flight"] == 0
    assert rows[1]["books"]["sessions"] == sum(r["calls"]["store"] for r in rows)
    assert doc["saturation_per_s"] > 0
    assert not list(tmp_path.glob("flatcake-node-load-*"))  # cleaned up


def test_docs_out_writes_the_rows_measured_under_the_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "generated" / "node-load.md"
    assert main(["bench", "--node-load", "--quick", "--dir", str(tmp_path), "--json",
                 "--p99-bound-ms", "1e9", "--docs-out", str(out)]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    text = out.read_text()
    first = text.splitlines()[0]
    # the command that reproduces the run, its rates and bound spelled out
    assert first.startswith("<!-- written by: flatcake bench --node-load --dir ")
    assert "--clients 2 --rates 20,40 --seconds 1 --p99-bound-ms 1e+09" in first
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(rows) == 3  # the head, one row per rate
    for line, r in zip(table[1:], rows, strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == f"{r['offered']:g}" and cells[2] == str(r["requests"])
        assert cells[-1] == "clean"
    assert "p99 lookup at 1000 requests/s: not run" in text
    assert "saturation rate:" in text


def test_bad_load_options_are_refused(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--node-load", "--rates", "10,x", "--dir", str(tmp_path)]) == 2
    assert "--rates must be numbers" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--clients must be an int >= 1"):
        LoadOptions(str(tmp_path), clients=0)


def test_the_books_count_reclaimed_sessions_and_refused_stores() -> None:
    from flatcake.bench.node_load import books_whole

    def books(sessions: int, used: int, gone: int = 0, rejected: int = 0) -> dict[str, int]:
        return {"sessions": sessions, "ssd_used_bytes": used,
                "sessions_reclaimed_ssd": gone, "stores_rejected": rejected}

    assert books_whole(books(4, 4 * 8192), 4)
    assert not books_whole(books(3, 3 * 8192), 4)  # a session lost, none reclaimed
    assert not books_whole(books(3, 3 * 8192 + 4096), 3)  # a session not whole
    # Past the SSD space's spans the oldest sessions are reclaimed: stored once each.
    assert books_whole(books(3686, 3686 * 8192, gone=410), 4096)
    assert not books_whole(books(3000, 3000 * 8192, gone=410), 4096)
    assert not books_whole(books(4, 4 * 8192, rejected=1), 4)
