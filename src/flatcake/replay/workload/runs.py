"""Block sets as *runs*: ``((start, end), ...)`` half-open ranges of dense block ids.

A request's blocks are a few runs (3.4 on average in the Claude Code trace), so the
caches do their per-block work with slices (``tick[s:e]``) instead of gathers over
thousands of scattered indices. Runs are kept in prefix order: the first run holds the
request's first blocks.
"""

from __future__ import annotations

import numpy as np

from flatcake.replay.workload.types import IdArray

Runs = tuple[tuple[int, int], ...]
"""Half-open id ranges in prefix order."""

EMPTY_RUNS: Runs = ()


def runs_len(runs: Runs) -> int:
    return sum(e - s for s, e in runs)


def slice_runs(runs: Runs, start: int, stop: int) -> Runs:
    """The blocks at positions ``[start, stop)`` of the sequence ``runs`` describes."""
    if stop <= start:
        return EMPTY_RUNS
    out: list[tuple[int, int]] = []
    pos = 0
    for s, e in runs:
        n = e - s
        lo = max(start - pos, 0)
        hi = min(stop - pos, n)
        if lo < hi:
            out.append((s + lo, s + hi))
        pos += n
        if pos >= stop:
            break
    return tuple(out)


def runs_of(ids: IdArray) -> Runs:
    """Runs of an id array (consecutive ids increasing by one merge)."""
    if len(ids) == 0:
        return EMPTY_RUNS
    brk = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate(([0], brk))
    ends = np.concatenate((brk, [len(ids)]))
    first = ids[starts].tolist()
    last = ids[ends - 1].tolist()
    return tuple((a, b + 1) for a, b in zip(first, last, strict=True))


def expand(runs: Runs) -> IdArray:
    """The ids of ``runs`` as one int32 array."""
    if not runs:
        return np.zeros(0, dtype=np.int32)
    if len(runs) == 1:
        s, e = runs[0]
        return np.arange(s, e, dtype=np.int32)
    return np.concatenate([np.arange(s, e, dtype=np.int32) for s, e in runs])
