"""``flatcake bench --quick`` end to end: every layout restores the same bytes, and the
command counts show the layouts apart. Timings are printed by the bench, never asserted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flatcake.bench.report import Bar
from flatcake.cli import build_parser, main
from flatcake.cli.bench import options_from_args
from flatcake.geometry import preset


def test_quick_run_end_to_end(direct_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--quick", "--dir", str(direct_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["layout"]: r for r in doc["layouts"]}
    assert list(rows) == ["device", "device-paged", "flatcake", "scattered", "per-chunk-files"]
    for row in rows.values():
        for field in ("gbps", "ratio_to_device", "read_commands", "bytes_read",
                      "bytes_useful", "restore_s"):
            assert field in row
        assert row["verified"] is True
        assert row["bytes_read"] >= row["bytes_useful"] > 0
    layers, turns, blocks = doc["num_layers"], doc["num_turns"], doc["num_blocks"]
    assert (layers, turns, blocks) == (32, 2, 512 // 16)
    useful = blocks * sum(doc["layer_block_bytes"])
    assert {rows[n]["bytes_useful"] for n in ("flatcake", "scattered", "per-chunk-files")} \
        == {useful}
    # FlatCake: at most one command per layer per turn; scattered: one per block per
    # layer; per-chunk-files: one per 256-token chunk.
    assert rows["flatcake"]["read_commands"] <= layers * turns
    assert rows["scattered"]["read_commands"] == blocks * layers
    assert rows["scattered"]["read_commands"] > rows["flatcake"]["read_commands"]
    assert rows["per-chunk-files"]["read_commands"] == 512 // 256
    # Only the restored request's bytes are read by the baselines; FlatCake's reads
    # also cover segment padding.
    assert rows["scattered"]["bytes_read"] == useful
    assert rows["device"]["ratio_to_device"] == 1.0
    # The device's own commands into the paged KV's slots: the same file bytes, one iovec
    # per block half, no staging buffer.
    assert rows["device-paged"]["bytes_read"] == rows["device"]["bytes_read"]
    assert rows["device-paged"]["read_commands"] == rows["device"]["read_commands"]
    assert rows["device-paged"]["staging_bytes"] == 0
    assert any(n.startswith("device-paged: ") for n in doc["notes"])
    for row in rows.values():
        assert row["bytes_per_command"] == row["bytes_read"] // row["read_commands"]
        assert row["cpu_ns_per_byte"] == pytest.approx(
            1e9 * row["cpu_s"] / row["bytes_useful"])
    assert doc["write"]["cpu_ns_per_byte"] == pytest.approx(
        1e9 * doc["write"]["cpu_s"] / doc["write"]["bytes_written"])
    assert any("transparent huge pages" in n or "4 KiB pages" in n for n in doc["notes"])
    # The bench's paged KV is page-aligned and 64 KiB blocks: FlatCake reads into it.
    assert "flatcake restore path: zero-copy" in doc["notes"]
    assert "flatcake write path: zero-copy" in doc["notes"]
    control = doc["control_plane"][0]
    assert control["num_blocks"] == blocks and control["lookup_and_plan_ms"] > 0
    assert doc["write"]["write_gbps"] > 0 and doc["write"]["bytes_written"] >= useful
    bars = {b["name"]: b for b in doc["bars"]}
    assert bars["flatcake read_commands / (layers x turns)"]["passed"] is True
    assert bars["every restore verified"]["passed"] is True
    assert "flatcake turn write / device sequential write" in bars
    # The files are gone unless --keep.
    assert list(direct_dir.iterdir()) == []


def test_write_rounds_are_paired_and_cleaned_up(
        direct_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--quick", "--rounds", "3", "--dir", str(direct_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    note = next(n for n in doc["notes"] if n.startswith("write rounds"))
    pairs = [p.split("/") for p in note.split(": ", 1)[1].split(", ")]
    assert len(pairs) == 3
    flatcake = sorted(float(f) for f, _ in pairs)
    device = sorted(float(d) for _, d in pairs)
    w = doc["write"]
    # Medians of the rounds (the note rounds to 2 decimals).
    assert w["write_gbps"] == pytest.approx(flatcake[1], abs=0.006)
    assert w["device_write_gbps"] == pytest.approx(device[1], abs=0.006)
    assert w["ratio_to_device"] == pytest.approx(w["write_gbps"] / w["device_write_gbps"])
    assert list(direct_dir.iterdir()) == []


def test_table_output(direct_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--quick", "--dir", str(direct_dir), "--context-tokens", "256",
                 "--turns", "1", "--keep"]) == 0
    out = capsys.readouterr().out
    for name in ("device", "flatcake", "scattered", "per-chunk-files", "lookup_and_plan",
                 "write:"):
        assert name in out
    assert "--context-tokens 256 --turns 1" in out
    # --keep leaves the run's files.
    kept = list(direct_dir.iterdir())
    assert len(kept) == 1 and (kept[0] / "store").is_dir()


def test_flags_override_quick() -> None:
    args = build_parser().parse_args(["bench", "--quick", "--rounds", "2", "--dir", "/x"])
    opts = options_from_args(args)
    assert (opts.rounds, opts.context_tokens, opts.use_fio, opts.directory) == (2, 512, False,
                                                                               "/x")
    default = options_from_args(build_parser().parse_args(["bench"]))
    assert (default.model, default.use_fio, default.scale_tokens) == ("llama-3.1-8b", True,
                                                                      219_000)


@pytest.mark.parametrize(("argv", "field"), [
    (["--context-tokens", "0"], "--context-tokens"),
    (["--turns", "0"], "--turns"),
    (["--rounds", "0"], "--rounds"),
    (["--scattered-sessions", "0"], "--scattered-sessions"),
    (["--read-threads", "0"], "--read-threads"),
])
def test_bad_flags_name_the_flag(argv: list[str], field: str) -> None:
    args = build_parser().parse_args(["bench", *argv])
    with pytest.raises(ValueError, match=field):
        options_from_args(args)


def test_too_few_blocks_for_the_turns(direct_dir: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "--quick", "--dir", str(direct_dir), "--context-tokens", "32",
               "--turns", "4"])
    assert rc == 2
    assert "--turns" in capsys.readouterr().err


def test_bar_directions() -> None:
    assert Bar("x", 0.95, ">=", 0.9).passed and not Bar("x", 0.85, ">=", 0.9).passed
    assert Bar("y", 0.01, "<=", 0.05).passed and not Bar("y", 0.06, "<=", 0.05).passed


def test_strict_exit_follows_the_bars(direct_dir: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bench", "--quick", "--dir", str(direct_dir), "--context-tokens", "64",
               "--turns", "1", "--json", "--strict"])
    doc = json.loads(capsys.readouterr().out)
    assert all(r["verified"] for r in doc["layouts"])
    assert rc == (0 if all(b["passed"] for b in doc["bars"]) else 1)


def test_quick_run_of_a_model_with_seven_layer_kinds(
        direct_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # DeepSeek-V4-Flash: layers of seven block sizes, 864 B to 513 KiB. Every layout still
    # restores the same bytes; FlatCake in one command per layer and turn.
    assert main(["bench", "--quick", "--dir", str(direct_dir), "--json",
                 "--model", "deepseek-v4-flash"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["layout"]: r for r in doc["layouts"]}
    assert list(rows) == ["device", "flatcake", "scattered", "per-chunk-files"]
    assert all(row["verified"] for row in rows.values())
    sizes, turns, blocks = doc["layer_block_bytes"], doc["num_turns"], doc["num_blocks"]
    assert sorted(set(sizes)) == [864, 4320, 17280, 18720, 65664, 74880, 525312]
    # Useful: what the engine needs, a sliding layer's last window only.
    useful = preset("deepseek-v4-flash").restore_bytes(blocks)
    assert useful < blocks * sum(sizes)
    assert {rows[n]["bytes_useful"] for n in ("flatcake", "scattered", "per-chunk-files")} \
        == {useful}
    assert rows["flatcake"]["read_commands"] <= len(sizes) * turns
    assert rows["scattered"]["read_commands"] == blocks * len(sizes)
    assert "device-paged not run: a block part of 864 bytes is not a multiple of 4096" \
        in doc["notes"]
