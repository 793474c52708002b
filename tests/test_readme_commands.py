"""Every command block of the README is run here, so the README cannot drift.

Each code block (fenced or indented) must follow a marker comment, a blank line above it:

    <!-- doc: run -->          run each command; it must succeed
    <!-- doc: long -->         run each command for LONG_BUDGET_S seconds: it must succeed or
                               still be running then (it is stopped with Ctrl-C); set
                               FLATCAKE_DOC_BUDGET_S=0 to run long blocks to the end
    <!-- doc: python -->       run the block with Python; it must succeed
    <!-- doc: python long -->  the same, for LONG_BUDGET_S seconds
    <!-- doc: toml -->         the block must load with ``load_config`` and equal the defaults
    <!-- doc: output -->       sample output or a file format: nothing to run
    <!-- doc: needs-model -->  needs a served model, <!-- doc: needs-gpu --> a GPU,
    <!-- doc: needs-engine --> the 3.3 GB vLLM engine virtualenv,
    <!-- doc: needs-cluster --> redis-server and the NIXL virtualenv: not run here
                               (tests/cluster/test_node_demo.py runs the cluster demo)
    <!-- doc: self -->         the test suite itself (``make test``)

Whatever the marker, every ``flatcake`` command line in any block is parsed by the real
argument parser, and every ``make`` target named must exist (``make -n``), so flags and
targets cannot drift even where a command is not run. Commands run in a scratch folder
that has ``../shared`` (the shared traces, when present), a ``my-trace.jsonl.gz`` (a small
native trace) and ``.venv/bin/{flatcake,python}`` pointing at this checkout; a ``make``
line runs the ``flatcake`` commands its target would run. Placeholders for the user's own
paths are substituted (``PLACEHOLDERS``). Blocks that read the shared traces are skipped
when they are absent.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from flatcake.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SHARED = REPO.parent / "shared"
KINDS = ("run", "long", "python", "python long", "toml", "output", "needs-model",
         "needs-gpu", "needs-engine", "needs-cluster", "self")
LONG_BUDGET_S = float(os.environ.get("FLATCAKE_DOC_BUDGET_S", "3"))
RUN_TIMEOUT_S = 120.0
PLACEHOLDERS = {"/path/on/the/disk": "{tmp}/disk", "/tmp/fcb/run": "{tmp}/fcb"}
_MARKER = re.compile(r"^<!-- doc: ([a-z-]+(?: long)?) -->$")


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the block's first line in the README
    kind: str
    lines: tuple[str, ...]

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"

    def commands(self) -> list[str]:
        """Shell commands: continuation lines joined, comments and blank lines dropped."""
        out: list[str] = []
        pending = ""
        for raw in self.lines:
            line = raw.strip()
            if not pending and (not line or line.startswith("#")):
                continue
            pending += line
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            try:
                shlex.split(pending)
            except ValueError:  # an open quote: the command goes on on the next line
                pending += "\n"
                continue
            out.append(pending)
            pending = ""
        return out


def readme_blocks(text: str) -> list[Block]:
    """Every code block with the marker above it (kind ``""`` when it has none)."""
    lines = text.splitlines()
    blocks: list[Block] = []

    def marker(before: int) -> str:
        j = before - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        m = _MARKER.match(lines[j].strip()) if j >= 0 else None
        return m.group(1) if m else ""

    i, prev_blank = 0, True
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            blocks.append(Block(i + 2, marker(i), tuple(lines[i + 1:j])))
            i, prev_blank = j + 1, False
            continue
        if prev_blank and line.startswith("    ") and line.strip():
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            while not lines[j - 1].strip():
                j -= 1
            blocks.append(Block(i + 1, marker(i), tuple(x[4:] for x in lines[i:j])))
            i, prev_blank = j, False
            continue
        prev_blank = not line.strip()
        i += 1
    return blocks


BLOCKS = readme_blocks(README.read_text())


def _id(b: Block) -> str:
    return f"L{b.line}-{b.kind or 'unmarked'}"


def test_every_block_is_marked() -> None:
    bad = [f"README.md:{b.line}: {b.lines[0][:60]!r}" for b in BLOCKS if b.kind not in KINDS]
    assert not bad, ("code blocks without a '<!-- doc: KIND -->' marker (kinds: "
                     f"{', '.join(KINDS)}; see tests/test_readme_commands.py): {bad}")
    assert len(BLOCKS) >= 15  # the extractor still finds the README's blocks


def _flatcake_argv(command: str) -> list[str] | None:
    words = shlex.split(command, comments=True)
    if words and words[0].endswith("flatcake") and "/" not in words[0].replace(
            ".venv/bin/", ""):
        return words[1:]
    if words[:3] in (["python", "-m", "flatcake.cli"], [".venv/bin/python", "-m",
                                                         "flatcake.cli"]):
        return words[3:]
    return None


@pytest.mark.parametrize("block", BLOCKS, ids=_id)
def test_flatcake_lines_parse_and_make_targets_exist(block: Block) -> None:
    if block.kind in ("output", "toml", "python", "python long"):
        return
    for command in block.commands():
        argv = _flatcake_argv(command)
        if argv is not None:
            try:
                build_parser().parse_args(argv)
            except SystemExit as exc:
                if exc.code:  # --help exits 0
                    pytest.fail(f"README.md:{block.line}: {command!r} does not parse")
        words = shlex.split(command, comments=True)
        if words and words[0] == "make":
            done = subprocess.run(["make", "-n", *words[1:]], cwd=REPO, capture_output=True,
                                  text=True, timeout=60)
            assert done.returncode == 0, f"README.md:{block.line}: {command}: {done.stderr}"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder like a checkout's root: ../shared, my-trace.jsonl.gz, .venv/bin shims."""
    from flatcake.traces import WorkloadSpec, generate_workload
    from flatcake.traces.readers.native import write_native

    top = tmp_path_factory.mktemp("readme")
    work = top / "work"
    (work / ".venv" / "bin").mkdir(parents=True)
    if SHARED.is_dir():
        (top / "shared").symlink_to(SHARED)
        trace = SHARED / "traces" / "weka-claude-code" / "weka_claude_code_traces.jsonl.gz"
        (work / trace.name).symlink_to(trace)
    write_native(generate_workload(WorkloadSpec(num_sessions=2)), work / "my-trace.jsonl.gz")
    for name, exe in (("flatcake", f'"{sys.executable}" -m flatcake.cli'),
                      ("python", f'"{sys.executable}"')):
        shim = work / ".venv" / "bin" / name
        shim.write_text(f'#!/bin/sh\nexec {exe} "$@"\n')
        shim.chmod(0o755)
    (work / ".venv" / "bin" / "activate").write_text(
        f'export PATH="{work / ".venv" / "bin"}:$PATH"\n')
    return work


def _env(work: Path) -> dict[str, str]:
    """The README's examples assume ``.venv/bin`` on PATH (its quick start says how)."""
    path = f"{work / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    pythonpath = f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    return {**os.environ, "PATH": path, "PYTHONPATH": pythonpath}


def _run(command: str, work: Path, budget_s: float | None, where: str,
         stdin: str | None = None) -> None:
    """Run ``command`` in ``work``; with a budget, a command still running then passes."""
    for old, new in PLACEHOLDERS.items():
        command = command.replace(old, new.format(tmp=work))
    proc = subprocess.Popen(["bash", "-c", command], cwd=work, env=_env(work),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    limit = budget_s if budget_s else RUN_TIMEOUT_S
    try:
        out, err = proc.communicate(stdin, timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: lets the command clean up
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        if budget_s:
            # Still working at the end of its budget; what it printed must hold no error
            # (but the KeyboardInterrupt of the Ctrl-C that stopped it).
            tail = err.rstrip().splitlines()[-1:] or [""]
            stopped = tail[0].startswith(("KeyboardInterrupt", "flatcake")) \
                and "interrupt" in tail[0].lower()
            assert stopped or ("Traceback" not in err and "error:" not in err), \
                f"{where}: {command!r} failed within its budget:\n{err[-2000:]}"
            return
        pytest.fail(f"{where}: {command!r} ran past {limit:.0f} s")
    assert proc.returncode == 0, (f"{where}: {command!r} exited {proc.returncode}\n"
                                  f"{out[-1500:]}\n{err[-2500:]}")


def _make_commands(target_line: str) -> list[str]:
    """The ``flatcake`` commands a ``make`` line would run (from ``make -n``)."""
    words = shlex.split(target_line, comments=True)
    done = subprocess.run(["make", "-n", *words[1:]], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True)
    return [line.strip() for line in done.stdout.splitlines()
            if re.match(r"^\S*bin/flatcake\b", line.strip())]


RUNNABLE = [b for b in BLOCKS if b.kind in ("run", "long", "python", "python long", "toml")]


@pytest.mark.slow
@pytest.mark.parametrize("block", RUNNABLE, ids=_id)
def test_readme_block_runs(block: Block, scratch: Path) -> None:
    where = f"README.md:{block.line}"
    if ("shared/traces" in block.text or "weka_claude_code" in block.text) \
            and not SHARED.is_dir():
        pytest.skip("needs ../shared/traces")
    if block.kind == "toml":
        from flatcake.config import FlatCakeConfig, load_config

        path = scratch / "readme.toml"
        path.write_text(block.text)
        assert load_config(path, env={}) == FlatCakeConfig(), \
            f"{where}: the README's config block no longer shows the defaults"
        return
    budget = LONG_BUDGET_S if block.kind.endswith("long") else None
    if block.kind.startswith("python"):
        _run(f'"{sys.executable}" -', scratch, budget, where, stdin=block.text)
        return
    if block.kind == "run":  # one shell, as a user would type the lines in a row
        _run("set -e\n" + "\n".join(block.commands()), scratch, None, where)
        return
    for command in block.commands():
        if command.startswith("make "):
            commands = _make_commands(command)
            assert commands, f"{where}: {command!r} runs no flatcake command"
        else:
            commands = [command]
        for c in commands:
            _run(c, scratch, budget, where)


def test_command_table_lists_every_command() -> None:
    from flatcake.cli import COMMANDS

    text = README.read_text()
    for name, (_, help_text) in COMMANDS.items():
        assert f"| `flatcake {name}` | {help_text} |" in text, f"README: no row for {name}"
