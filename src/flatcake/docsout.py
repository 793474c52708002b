"""Result tables for the docs site, written by the commands that measure them.

A command given ``--docs-out FILE`` (``flatcake bench``, the replay report,
``scripts/loadgen_compare.py``) writes its tables there as markdown, under a first line
naming the command and a line saying when, at which commit and on what machine it ran::

    <!-- written by: flatcake bench --dir /nvme --docs-out docs/results/generated/bench.md -->
    Measured 2026-12-04 10:31 UTC at commit 003f127, on 2 cores, 23.4 GiB, load average
    0.4 at the start and 2.1 at the end, by `flatcake bench ...`.

    | layout | GB/s | ... |

The pages under ``docs/results/`` include these files when the site is built
(``scripts/docs_hooks.py``), so no results table on the site is pasted by hand;
``tests/test_doc_commands.py`` checks that every generated file names a command that
parses.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MARKER = "<!-- written by: "


def load_average() -> float:
    """The 1-minute load average (0.0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def commit() -> str:
    """The short commit of the checkout this package runs from, ``+changes`` when its
    tracked files differ from it; ``unknown`` outside a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here,
                              capture_output=True, text=True, timeout=10, check=True)
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "."], cwd=here,
                               capture_output=True, timeout=10).returncode != 0
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+changes" if dirty else "")


def _memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return 0.0


@dataclass(frozen=True, slots=True)
class Start:
    """What a measuring command notes when it starts: the code it runs and the load.

    Attributes:
        commit: ``commit()`` at the start (the code measured, even if the checkout
            moves on while the command runs).
        load_average: the 1-minute load average at the start.
    """

    commit: str
    load_average: float


def start() -> Start:
    return Start(commit(), load_average())


def provenance(command: str, started: Start) -> str:
    """The two lines above a generated table: the marker and when/where/how it ran."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return (f"{MARKER}{command} -->\n"
            f"Measured {when} at commit {started.commit}, on {os.cpu_count()} cores, "
            f"{_memory_gib():.1f} GiB, load average {started.load_average:.1f} at the start "
            f"and {load_average():.1f} at the end, by `{command}`.\n")


def typed(prog: str, argv: Sequence[str] | None) -> list[str]:
    """The command as typed, for ``write``: an argparse ``prog`` and the arguments its
    ``main(argv)`` parsed (``sys.argv[1:]`` when ``argv`` is ``None``)."""
    return [*prog.split(), *(sys.argv[1:] if argv is None else argv)]


def write(path: str | os.PathLike[str], argv: Sequence[str], body: str,
          started: Start) -> Path:
    """Write ``body`` (markdown) to ``path`` under its provenance; ``argv`` is the command
    as typed (``["flatcake", "bench", ...]``), ``started`` what ``start()`` noted."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(provenance(shlex.join(argv), started) + "\n" + body.rstrip() + "\n")
    return out
