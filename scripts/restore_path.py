"""Count the path of one vLLM restore, as it runs: the FlatCake source files whose
functions are called, and the package boundaries the calls cross, from the scheduler
half's ``num_matched_tokens`` (what ``get_num_new_matched_tokens`` calls) to the
worker's report of the restored bytes.

Usage: ``python scripts/restore_path.py [--markdown]`` (from the repository root, with
the project's virtualenv; ``--markdown``: the paragraph and file list the architecture
page shows, written into it at docs build time by ``scripts/docs_hooks.py``). It drives
the connector's two halves without an engine (the tests' sides harness): a first turn of
12 blocks is stored on SSD, then a second turn (its prompt: those 12 blocks and 2 new
ones) restores them through FC-MAS and the staging window. Every thread is traced
(``sys.settrace`` and ``threading.settrace``, installed before the two halves are
built, so the threads they start at set-up are traced too) from that turn's lookup
until the scheduler half releases it to the engine.

What the window holds is a restore and nothing else: the second turn's lookup (which
asks whether a store in flight writes its next block, as every extending turn's does),
its load, the steps that carry it and the reports that finish it. Its prompt is not
computed and it does not finish in the window, so nothing is placed, allocated or
written (checked: the control plane prepares no store meanwhile). The steps' own
per-step calls run too (``build_step`` asks for new stores and window releases even
when it carries only a restore), and so does the staging buffers' allocation (each
window's, on the first restore that uses it). The load and read threads are not started
in the window: the worker half starts them (and pins them) when it registers the KV,
before the window opens; what they run in the window is traced like the rest.
Reported: files (distinct source files with a call), packages, and package hops
(distinct caller -> callee file pairs whose packages differ). Module-level code and
comprehensions count for their file; nothing outside ``src/flatcake`` is counted.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# This checkout's flatcake (and its tests' harness), whatever the virtualenv installed:
# the docs build runs this script in a child process with no PYTHONPATH.
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.connectors.sides_harness import Harness, finish, tokens, view  # noqa: E402

import flatcake  # noqa: E402

SRC = Path(flatcake.__file__).resolve().parent


def _package(path: str) -> str:
    rel = Path(path).resolve().relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else "(top)"


class _Trace:
    def __init__(self) -> None:
        self.files: set[str] = set()
        self.hops: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        # Installed in every thread from the start (a thread started before
        # ``threading.settrace`` is never traced), counting only while active.
        self.active = False

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        if event != "call" or not self.active:
            return None
        callee = frame.f_code.co_filename
        if not callee.startswith(str(SRC)):
            return None
        with self._lock:
            self.files.add(callee)
            caller = frame.f_back
            while caller is not None and not caller.f_code.co_filename.startswith(str(SRC)):
                caller = caller.f_back
            if caller is not None and caller.f_code.co_filename != callee:
                a, b = caller.f_code.co_filename, callee
                if _package(a) != _package(b):
                    self.hops.add((a, b))
        return None


def count() -> tuple[list[str], set[tuple[str, str]]]:
    """The restore's files (relative to ``src/flatcake``, sorted) and package hops."""
    trace = _Trace()
    threading.settrace(trace)
    sys.settrace(trace)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            h = Harness(Path(tmp))
            first = list(range(100, 148))  # 12 blocks of 4 tokens
            finish(h, "a", first, list(range(12)), out=3, session="s")
            h.step()  # the first turn is written (first turn of a session: SSD)
            v = view("b", tokens(first, 8, 300), session="s")
            stores_before = _stores_prepared(h)
            trace.active = True
            try:
                n, is_async = h.sched.num_matched_tokens(v, 0)
                h.sched.after_alloc("b", list(range(20, 40)), n)
                while "b" not in h.released:
                    h.step()
            finally:
                trace.active = False
            stores_after = _stores_prepared(h)
            h.close()
    finally:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]
    if (n, is_async) != (12 * 4, True):
        raise RuntimeError(f"expected an async restore of 48 tokens, got {n}, {is_async}")
    if stores_after != stores_before:
        raise RuntimeError(f"the traced window prepared stores: {stores_before} -> "
                           f"{stores_after}; it must count a restore only")
    return sorted(str(Path(f).resolve().relative_to(SRC)) for f in trace.files), trace.hops


def _stores_prepared(h: Harness) -> tuple[int, int]:
    """(stores placed so far, stores in flight): unchanged while nothing is stored."""
    stats = h.sched.control.stats()
    return sum(stats.placements_by_rule.values()), stats.stores_in_flight


def main() -> int:
    markdown = sys.argv[1:] == ["--markdown"]
    if sys.argv[1:] and not markdown:
        print(f"usage: {sys.argv[0]} [--markdown]", file=sys.stderr)
        return 2
    files, hops = count()
    packages = sorted({_package(str(SRC / f)) for f in files})
    if markdown:
        print(f"Counted when this page was built (`python scripts/restore_path.py`: the "
              f"connector's two halves without an engine, one 12-block SSD restore, every "
              f"thread traced), the path touches **{len(files)} source files** in "
              f"{len(packages)} packages ({', '.join(packages)}) and crosses "
              f"**{len(hops)} distinct caller -> callee file pairs** between "
              f"packages.\n\n!!! note \"The {len(files)} files\"\n")
        for f in files:
            print(f"    - `{f}`")
        return 0
    print(f"files: {len(files)}")
    for f in files:
        print(f"  {f}")
    print(f"packages: {len(packages)} ({', '.join(packages)})")
    print(f"package hops (distinct caller -> callee files across packages): "
          f"{len(hops)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
