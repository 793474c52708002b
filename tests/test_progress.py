"""Progress bars: drawn only when a command turns them on for a person at a terminal,
never with ``--json``, and never changing what the work computes."""

from __future__ import annotations

import gzip
import io
import json
import sys
from pathlib import Path

import pytest

from flatcake import progress
from flatcake.cli import main
from flatcake.replay.presets import get_preset
from flatcake.replay.simulate import run_replay
from flatcake.replay.workload.source import load_workload
from flatcake.traces.source import open_binary


def test_silent_by_default_and_items_pass_through() -> None:
    assert not progress.is_shown()
    raw = io.BytesIO(b"abc")
    assert progress.reading(raw, 3, "x") is raw
    assert list(progress.track(range(5), "x")) == [0, 1, 2, 3, 4]
    with progress.shown(True):
        assert progress.is_shown()
        assert list(progress.track(iter("ab"), "x")) == ["a", "b"]
    assert not progress.is_shown()


def test_counted_reads_give_the_same_bytes(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    lines = b"".join(b'{"n": %d}\n' % i for i in range(20000))
    for name, data in (("plain.jsonl", lines), ("packed.jsonl.gz", gzip.compress(lines))):
        path = tmp_path / name
        path.write_bytes(data)
        with progress.shown(True), open_binary(path) as fh:
            assert fh.readline() == b'{"n": 0}\n'
            assert b"".join(fh) == lines[len(b'{"n": 0}\n'):]
        err = capsys.readouterr().err
        assert f"reading {name}" in err and "B/s" in err  # a byte bar with its rate


def test_replay_with_a_bar_computes_the_same_run(capsys: pytest.CaptureFixture[str]) -> None:
    wl, _ = load_workload(None, sessions=4)
    preset = get_preset("paper")
    quiet = run_replay(wl, "flatcake", 1.0, preset).to_dict()
    with progress.shown(True):
        shown = run_replay(wl, "flatcake", 1.0, preset).to_dict()
    assert f"/{wl.num_requests}" in capsys.readouterr().err  # requests counted to the total
    for d in (quiet, shown):
        d.pop("wall_s"), d.pop("cpu_s")
    assert shown == quiet


def test_cli_draws_on_a_terminal_but_never_with_json(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    argv = ["replay", "--sessions", "2", "--rate", "1"]
    assert main(argv) == 0
    assert "replay flatcake" in capsys.readouterr().err
    assert main([*argv, "--json"]) == 0
    got = capsys.readouterr()
    assert got.err == "" and json.loads(got.out)["system"] == "flatcake"
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)  # piped: no bar either
    assert main(argv) == 0
    assert capsys.readouterr().err == ""
