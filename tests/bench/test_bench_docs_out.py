"""Result tables for the docs site: ``flatcake bench --docs-out`` writes its tables under
the command that wrote them, the commit it measured and the machine's load; the commit
is the one the run started on, even when the checkout moves on meanwhile."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from flatcake import docsout
from flatcake.cli import build_parser, main


def test_bench_writes_its_tables_under_the_command(direct_dir: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    commits = iter(["aaaa111", "bbbb222"])  # the checkout moves on while the bench runs
    monkeypatch.setattr(docsout, "commit", lambda: next(commits))
    out = tmp_path / "generated" / "bench.md"
    assert main(["bench", "--quick", "--dir", str(direct_dir), "--context-tokens", "256",
                 "--turns", "1", "--docs-out", str(out)]) == 0
    first, second, *rest = out.read_text().splitlines()
    assert first.startswith(docsout.MARKER) and first.endswith(" -->")
    command = shlex.split(first[len(docsout.MARKER):-len(" -->")])
    assert command[:2] == ["flatcake", "bench"] and "--docs-out" in command
    args = build_parser(command[1:]).parse_args(command[1:])  # runs again as written
    assert (args.context_tokens, args.num_turns, args.docs_out) == (256, 1, str(out))
    assert " at commit aaaa111," in second and "bbbb222" not in second
    table = [line for line in rest if line.startswith("| `")]
    assert [line.split("`")[1] for line in table] == [
        "device", "device-paged", "flatcake", "scattered", "per-chunk-files"]
    assert all("| yes |" in line for line in table)  # every restore verified
    assert any(line.startswith("| flatcake read_commands") for line in rest)


def test_the_commit_of_this_checkout_is_named() -> None:
    name = docsout.commit()
    assert name == "unknown" or len(name.split("+")[0]) >= 7
