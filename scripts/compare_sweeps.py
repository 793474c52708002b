"""Compare two replay results field by field, ignoring what measures the machine.

Usage: ``python scripts/compare_sweeps.py BEFORE.json AFTER.json`` with two ``sweep.json``
files (``flatcake sweep``) or two ``flatcake replay --json`` outputs. Every metric (hit
rates, TTFTs, counters, placements) must be equal; wall and CPU times, load timings,
dates and process counts are ignored. Exit status 1 and the first differences when they
differ: a change meant to make the replay faster must leave this at 0.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

IGNORED = frozenset({"wall_s", "cpu_s", "timings", "load_timings", "date", "jobs",
                     "run_wall_s_max", "run_cpu_s_max"})


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths where ``a`` and ``b`` differ (NaN equals NaN; ignored keys skipped)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            if k in IGNORED:
                continue
            if k not in a or k not in b:
                out.append(f"{path}/{k}: only in {'after' if k in b else 'before'}")
            else:
                out += differences(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    with open(argv[0]) as fa, open(argv[1]) as fb:
        before, after = json.load(fa), json.load(fb)
    diffs = differences(before, after)
    runs = len(before["runs"]) if isinstance(before, dict) and "runs" in before else 1
    print(f"{argv[0]} vs {argv[1]}: {runs} runs, {len(diffs)} differing fields")
    for line in diffs[:30]:
        print("  " + line)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
