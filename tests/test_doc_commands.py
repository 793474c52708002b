"""Every command block of the README and of the docs pages (docs/**/*.md) is run or
checked here, so the docs cannot drift.

Each code block (fenced or indented) must follow a marker comment, a blank line above it:

    <!-- doc: run -->          run each command; it must succeed
    <!-- doc: long -->         run each command for LONG_BUDGET_S seconds: it must succeed or
                               still be running then (it is stopped with Ctrl-C); set
                               FLATCAKE_DOC_BUDGET_S=0 to run long blocks to the end
    <!-- doc: python -->       run the block with Python; it must succeed
    <!-- doc: python long -->  the same, for LONG_BUDGET_S seconds
    <!-- doc: toml -->         the block must load with ``load_config`` (the keys and their
                               defaults are generated: ``flatcake.config_reference``)
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

Results tables are written by the commands that measure them (``--docs-out``, see
``flatcake.docsout``) into docs/results/generated/, each under a line naming its
command; a table of measured figures anywhere else in docs/ fails here (the dated
history page is the record of past runs and is the one exception).
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
DOCS = REPO / "docs"
GENERATED = DOCS / "results" / "generated"
HISTORY = DOCS / "results" / "history.md"
SHARED = REPO.parent / "shared"
KINDS = ("run", "long", "python", "python long", "toml", "output", "needs-model",
         "needs-gpu", "needs-engine", "needs-cluster", "self")
LONG_BUDGET_S = float(os.environ.get("FLATCAKE_DOC_BUDGET_S", "3"))
RUN_TIMEOUT_S = 120.0
PLACEHOLDERS = {"/path/on/the/disk": "{tmp}/disk", "/tmp/fcb/run": "{tmp}/fcb"}
_MARKER = re.compile(r"^<!-- doc: ([a-z-]+(?: long)?) -->$")


@dataclass(frozen=True)
class Block:
    path: str  # the page, relative to the repository
    line: int  # 1-based line of the block's first line in the page
    kind: str
    lines: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

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


def page_blocks(text: str, path: str = "README.md") -> list[Block]:
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
            blocks.append(Block(path, i + 2, marker(i), tuple(lines[i + 1:j])))
            i, prev_blank = j + 1, False
            continue
        if prev_blank and line.startswith("    ") and line.strip():
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            while not lines[j - 1].strip():
                j -= 1
            blocks.append(Block(path, i + 1, marker(i), tuple(x[4:] for x in lines[i:j])))
            i, prev_blank = j, False
            continue
        prev_blank = not line.strip()
        i += 1
    return blocks


def pages() -> list[Path]:
    """The README and every docs page but the generated tables."""
    return [README, *sorted(p for p in DOCS.rglob("*.md") if GENERATED not in p.parents)]


BLOCKS = [b for page in pages()
          for b in page_blocks(page.read_text(), str(page.relative_to(REPO)))]


def _id(b: Block) -> str:
    return f"{b.path}:L{b.line}-{b.kind or 'unmarked'}"


def test_every_block_is_marked() -> None:
    bad = [f"{b.where}: {b.lines[0][:60]!r}" for b in BLOCKS if b.kind not in KINDS]
    assert not bad, ("code blocks without a '<!-- doc: KIND -->' marker (kinds: "
                     f"{', '.join(KINDS)}; see tests/test_doc_commands.py): {bad}")
    assert len(BLOCKS) >= 40  # the extractor still finds the pages' blocks
    assert any(b.path == "README.md" for b in BLOCKS)


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
                    pytest.fail(f"{block.where}: {command!r} does not parse")
        words = shlex.split(command, comments=True)
        if words and words[0] == "make":
            done = subprocess.run(["make", "-n", *words[1:]], cwd=REPO, capture_output=True,
                                  text=True, timeout=60)
            assert done.returncode == 0, f"{block.where}: {command}: {done.stderr}"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder like a checkout's root: ../shared, my-trace.jsonl.gz, .venv/bin shims."""
    from flatcake.traces import WorkloadSpec, generate_workload
    from flatcake.traces.readers.native import write_native

    top = tmp_path_factory.mktemp("docs")
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
    """The examples assume ``.venv/bin`` on PATH (getting started says how)."""
    path = f"{work / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    pythonpath = f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    return {**os.environ, "PATH": path, "PYTHONPATH": pythonpath}


def _foreground_signals() -> None:
    """In the child, before ``bash``: Ctrl-C and Ctrl-\\ do what they do to a terminal's
    foreground job. A test run started in the background (``cmd &`` in a script, as a CI
    runner may) inherits them ignored, and then the Ctrl-C that ends a command at its
    budget would stop only the children that set their own handler (``flatcake serve``)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def _run(command: str, work: Path, budget_s: float | None, where: str,
         stdin: str | None = None) -> None:
    """Run ``command`` in ``work``; with a budget, a command still running then passes."""
    for old, new in PLACEHOLDERS.items():
        command = command.replace(old, new.format(tmp=work))
    proc = subprocess.Popen(["bash", "-c", command], cwd=work, env=_env(work),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_foreground_signals)
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
def test_doc_block_runs(block: Block, scratch: Path) -> None:
    where = block.where
    if ("shared/traces" in block.text or "weka_claude_code" in block.text) \
            and not SHARED.is_dir():
        pytest.skip("needs ../shared/traces")
    if block.kind == "toml":
        from flatcake.config import load_config

        path = scratch / "docs.toml"
        path.write_text(block.text)
        load_config(path, env={})  # every key known, every value valid
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


# A markdown table row holding a measured figure: a number with a unit of speed, time,
# share or cost (GB/s, req/s, ns/B, s, ms, us, %, x).
_MEASURED = re.compile(r"\d(?:\.\d+)?\s*(?:GB/s|req/s|ns/B|ms|us|s|%|x)(?:\W|$)")


def _tables_with_figures(text: str) -> list[int]:
    """1-based lines of table rows holding a measured figure, outside code blocks."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("|") and _MEASURED.search(line):
            out.append(n)
    return out


def test_no_results_table_is_typed_into_the_docs() -> None:
    typed = [f"{page.relative_to(REPO)}:{n}" for page in pages()[1:] if page != HISTORY
             for n in _tables_with_figures(page.read_text())]
    assert not typed, ("tables of measured figures typed into a page; have the command "
                       "that measures them write them (--docs-out, flatcake.docsout) and "
                       f"include the file: {typed}")
    assert _tables_with_figures("| flatcake | 1.62 GB/s |\n")  # the check still bites


def test_every_generated_table_names_the_command_that_wrote_it() -> None:
    from flatcake.docsout import MARKER

    for path in sorted(GENERATED.glob("*.md")):
        first, second = path.read_text().splitlines()[:2]
        assert first.startswith(MARKER) and first.endswith(" -->"), \
            f"{path.name}: not written by a command (no {MARKER!r} line)"
        command = first[len(MARKER):-len(" -->")]
        assert second.startswith("Measured ") and " at commit " in second, path.name
        argv = _flatcake_argv(command)
        if argv is not None:
            build_parser().parse_args(argv)
        else:  # python -m MODULE or python scripts/X.py
            words = shlex.split(command)
            assert words[1] == "-m" or (REPO / words[1]).is_file(), \
                f"{path.name}: {command!r} names no command of this checkout"


def test_every_include_names_a_generated_file_and_results_at_a_glance_cite_them() -> None:
    for page in pages()[1:]:
        for name in re.findall(r"^<!-- include: (\S+) -->$", page.read_text(), re.M):
            assert (page.parent / name).resolve().parent == GENERATED, \
                f"{page.relative_to(REPO)}: includes {name}, outside {GENERATED}"
    glance = README.read_text().split("## Results at a glance", 1)[1].split("\n## ", 1)[0]
    for row in [r for r in glance.splitlines() if r.startswith("| ") and "](" in r]:
        page = re.search(r"\]\((docs/results/\w+\.md)\)", row)
        assert page, f"README results at a glance: {row!r} links to no results page"
        # The row's commit is one a table the page includes was measured at.
        linked = REPO / page.group(1)
        commits = []
        for name in re.findall(r"^<!-- include: (\S+) -->$", linked.read_text(), re.M):
            provenance = (linked.parent / name).read_text().splitlines()[1]
            commit = re.search(r"at commit (\w+)", provenance)
            assert commit, f"{name}: no commit in its provenance line"
            commits.append(commit.group(1))
        assert not commits or any(c in row for c in commits), \
            f"README results at a glance: {row!r} cites none of {page.group(1)}'s runs " \
            f"({', '.join(commits)})"


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """``mkdocs build --strict``: a broken link, nav entry or API reference fails it."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "--site-dir", str(tmp_path / "site")], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
