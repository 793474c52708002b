"""``flatcake analyze`` end to end: text, JSON, plot, built-in workload, errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from flatcake.cli import main

Writer = Callable[..., Path]
ISSUE_METRICS = (
    "requests", "block_accesses", "unique_blocks", "share_blocks_used_once",
    "max_prefix_hit_rate", "reuse_distance_requests_median", "reuse_distance_requests_p90",
    "reuse_gap_seconds_median", "reuse_gap_seconds_p90", "input_tokens_mean",
    "input_tokens_p99", "sessions", "turns_per_session_mean", "session_context_tokens_mean",
    "session_context_tokens_p99", "session_kv_bytes_mean", "session_kv_bytes_p99",
)


def _mooncake(write_lines: Writer) -> Path:
    return write_lines("mc.jsonl", [
        {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 2000, "input_length": 1500, "output_length": 5, "hash_ids": [0, 1, 2]},
    ])


def test_json_has_the_issue_metrics(write_lines: Writer,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(_mooncake(write_lines)), "--json", "--model",
                 "deepseek-v3"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ISSUE_METRICS:
        assert key in out, key
    assert out["max_prefix_hit_rate"] == pytest.approx(2 / 5)
    assert out["reuse_gap_seconds_median"] == 2
    assert out["sessions"] is None and out["model"] == "deepseek-v3"
    assert out["recommendation"]["lines"]


def test_text_report_and_plot(write_lines: Writer, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "out.png"
    assert main(["analyze", str(_mooncake(write_lines)), "--plot", str(png),
                 "--memory-gib", "8"]) == 0
    text = capsys.readouterr().out
    assert "max_prefix_hit_rate" in text and "40.00%" in text
    assert "recommendation:" in text and "8.00 GiB of memory" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_builtin_workload_is_the_default(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    saved = tmp_path / "w.jsonl.gz"
    assert main(["analyze", "--sessions", "3", "--seed", "9", "--json",
                 "--save", str(saved)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sessions"] == 3 and out["source_format"] == "generated"
    assert out["session_kv_bytes_mean"] > 0
    # The saved workload reads back to the same figures.
    assert main(["analyze", str(saved), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["max_prefix_hit_rate"] == out["max_prefix_hit_rate"]
    assert again["block_accesses"] == out["block_accesses"]


def test_lengths_only_trace_says_so(write_lines: Writer,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = write_lines("az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                       "2023-11-16 18:17:03.1,100,5\n2023-11-16 18:17:04.1,300,7\n")
    assert main(["analyze", str(path)]) == 0
    text = capsys.readouterr().out
    assert "prefix statistics (reuse, hit rate, distances) are unavailable" in text
    assert "max_prefix_hit_rate" not in text


def test_bad_input_fails_with_location_or_is_skipped_and_counted(
        write_lines: Writer, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_lines("mc.jsonl", [
        {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 1, "input_length": -3, "output_length": 5, "hash_ids": []},
    ])
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2: field 'input_length'" in err
    assert main(["analyze", str(path), "--skip-bad"]) == 0
    out = capsys.readouterr().out
    assert "skipped 1 malformed lines" in out and ":2:" in out
    assert main(["analyze", str(path), "--format", "azure"]) == 2
    assert "<header>" in capsys.readouterr().err
