"""The path of one vLLM restore (``scripts/restore_path.py``): what it counts is a
restore and nothing else, it stays within its bound, and the architecture page shows
the count made when the site is built, never one typed by hand."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "design" / "architecture.md"
MAX_FILES = 27  # the count once the load threads start at registration; it may only go down
# What a restore with nothing to settle, no memory copy, no early copy, no damage and
# no sliding window never asks (each is skipped by a test of an empty part at its one
# caller), nor the geometry (a local restore's FC-MAS weight is its read plan's bytes),
# nor the read plan's values (each piece carries where its bytes go).
SKIPPED = {"control/reclaimer.py", "control/damage.py", "control/copies.py",
           "control/spare.py", "control/windows.py", "control/stores.py", "geometry.py",
           "readplan.py"}


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_restore_reads_ssd_stores_nothing_and_stays_within_its_bound() -> None:
    files, hops = _script("restore_path").count()  # raises if a store was prepared
    assert len(files) <= MAX_FILES, files
    # It read the SSD through the staging window, and planned no store: neither
    # placement nor allocation ran.
    assert {"cio/staging.py", "cio/readers.py", "plan/reads.py"} <= set(files)
    assert not {"control/placement.py", "control/alloc.py", "cio/writer.py"} & set(files)
    # A restore asks the SSD space nothing: its segments carry their file and offset.
    assert "control/ssd_space.py" not in files
    # The worker half started its load threads when it registered the KV: a first
    # restore starts (and pins) none.
    assert "cio/affinity.py" not in files
    assert not SKIPPED & set(files), SKIPPED & set(files)
    assert all(a != b for a, b in hops)


def test_the_architecture_page_types_no_count_of_the_path() -> None:
    text = PAGE.read_text()
    assert "<!-- restore-path -->" in text
    typed = re.findall(r"\b\d+ (?:source )?files\b|\b\d+ (?:package )?hops\b|\b\d+ / \d+\b",
                       text)
    assert typed == []


def test_the_script_counts_this_checkout_whatever_is_installed() -> None:
    # As the docs build runs it: a child process, no PYTHONPATH (the virtualenv's
    # flatcake may be another checkout's).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "restore_path.py")],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                         check=True)
    files, _ = _script("restore_path").count()
    assert run.stdout.splitlines()[1:len(files) + 1] == [f"  {f}" for f in files]


def test_the_built_page_shows_the_count() -> None:
    hooks = _script("docs_hooks")
    page = SimpleNamespace(file=SimpleNamespace(abs_src_path=str(PAGE)))
    built = str(hooks.on_page_markdown(PAGE.read_text(), page, None, None))
    assert "<!-- restore-path -->" not in built
    files, _ = _script("restore_path").count()
    assert f"**{len(files)} source files**" in built
    assert all(f"- `{f}`" in built for f in files)
