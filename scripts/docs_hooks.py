"""mkdocs hooks of the docs site (``mkdocs.yml``: ``hooks``).

- ``<!-- cli-reference -->`` in a page becomes the CLI reference generated from the
  real parser (``flatcake.cli.reference``).
- ``<!-- config-reference -->`` becomes every configuration key, generated from the
  schema and the strings documenting its fields (``flatcake.config_reference``).
- ``<!-- restore-path -->`` becomes the files and package hops of one vLLM restore,
  counted as it runs (``scripts/restore_path.py --markdown``, in a child process).
- ``<!-- include: generated/NAME.md -->`` becomes that file, relative to the page: the
  tables a measuring command wrote with ``--docs-out`` (``flatcake.docsout``), its
  headings one level down so they sit under the page's own. A file not written yet
  becomes a note that says so; the page names the command that writes it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's flatcake, whatever is installed

CLI = "<!-- cli-reference -->"
CONFIG = "<!-- config-reference -->"
RESTORE_PATH = "<!-- restore-path -->"
INCLUDE = re.compile(r"^<!-- include: (\S+) -->$", re.MULTILINE)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any, **_: Any) -> str:
    if CLI in markdown:
        from flatcake.cli.reference import markdown as cli_reference

        markdown = markdown.replace(CLI, cli_reference())
    if CONFIG in markdown:
        from flatcake.config_reference import markdown as config_reference

        markdown = markdown.replace(CONFIG, config_reference())
    if RESTORE_PATH in markdown:
        markdown = markdown.replace(RESTORE_PATH, _restore_path())
    here = Path(page.file.abs_src_path).parent

    def include(m: re.Match[str]) -> str:
        path = here / m.group(1)
        if not path.is_file():
            return (f"!!! note \"Not measured yet\"\n    No run has written "
                    f"`{m.group(1)}` yet: the command above writes it.\n")
        return _demoted(path.read_text())

    return INCLUDE.sub(include, markdown)


def _restore_path() -> str:
    """The restore path's counts; the build fails if they cannot be counted (a page
    with stale numbers is worse than none)."""
    run = subprocess.run([sys.executable, str(ROOT / "scripts/restore_path.py"),
                          "--markdown"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    if run.returncode != 0:
        raise RuntimeError(f"scripts/restore_path.py failed:\n{run.stdout}{run.stderr}")
    return run.stdout


def _demoted(markdown: str) -> str:
    """Every heading one level deeper (``## x`` -> ``### x``), code blocks left alone."""
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        out.append("#" + line if not fenced and line.startswith("#") else line)
    return "\n".join(out) + "\n"
