"""The command line starts without its heavy dependencies: ``flatcake --help`` imports
no subcommand, and commands that move no KV bytes never import torch (1-2 s of CPU on a
small machine). Each case runs in a fresh interpreter, as a user's shell would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flatcake.cli import COMMANDS, build_parser

SRC = Path(__file__).resolve().parents[1] / "src"

_PROBE = """
import contextlib, io, json, sys
from flatcake.cli import main
out = io.StringIO()
try:
    with contextlib.redirect_stdout(out):
        rc = main(sys.argv[1:])
except SystemExit as exc:
    rc = exc.code
heavy = ("torch", "matplotlib", "flatcake.store.store", "tqdm")
print(json.dumps({"rc": rc, "out": out.getvalue(),
                  "loaded": sorted(m for m in heavy if m in sys.modules),
                  "commands": sorted(m for m in sys.modules if m.startswith("flatcake.cli.")),
                  "flatcake": sorted(m for m in sys.modules if m.startswith("flatcake."))}))
"""


def _probe(*argv: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True,
                          text=True, env=env, timeout=120, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_top_level_help_imports_no_command() -> None:
    got = _probe("--help")
    assert got["rc"] == 0
    assert got["loaded"] == [] and got["commands"] == []
    # Not even the control plane: the package exports resolve on first use.
    assert set(got["flatcake"]) <= {"flatcake.cli", "flatcake.progress"}
    for name in COMMANDS:  # every command is still listed, with its help
        assert name in str(got["out"])


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_command_help_imports_only_its_module_and_no_torch(command: str) -> None:
    got = _probe(command, "--help")
    assert got["rc"] == 0 and "usage: flatcake " + command in str(got["out"])
    assert got["loaded"] == []
    assert set(got["commands"]) <= {COMMANDS[command][0], "flatcake.cli.replay"}


def test_torch_free_commands_stay_torch_free() -> None:
    got = _probe("replay", "--explain")
    assert got["rc"] == 0 and "preset paper" in str(got["out"])
    assert got["loaded"] == []
    got = _probe("analyze", "--sessions", "2", "--json")
    assert got["rc"] == 0 and json.loads(str(got["out"]))["sessions"] >= 2
    assert "torch" not in got["loaded"]


def test_inspect_and_fsck_read_a_store_without_torch(tmp_path: Path) -> None:
    (tmp_path / "sessions").mkdir()  # an empty store root
    for command in ("inspect", "fsck"):
        got = _probe(command, str(tmp_path))
        assert got["rc"] == 0 and "0 " in str(got["out"])
        assert got["loaded"] == [], command


def test_full_parser_has_every_command() -> None:
    parser = build_parser()
    for name in COMMANDS:
        args = parser.parse_args([name, "x"] if name in ("inspect", "fsck") else [name])
        assert args.command == name and callable(args.func)


def test_explain_alone_exits_and_with_a_run_keeps_json_clean(
        capsys: pytest.CaptureFixture[str]) -> None:
    from flatcake.cli import main

    assert main(["replay", "--explain"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("preset paper:") and "hit_rate_gpu" not in out
    assert main(["replay", "--explain", "--sessions", "2", "--rate", "1", "--json"]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out)["rate_req_s"] == 1.0  # stdout is JSON only
    assert got.err.startswith("preset paper:")
