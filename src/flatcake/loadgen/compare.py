"""The tables of a side-by-side loadgen comparison (``scripts/loadgen_compare.py``).

A run record is one loadgen run against one server configuration::

    {"repeat": r, "config": "flatcake", "working_set": 4 | None (a trace),
     "summary": {...loadgen's summary...}, "cpu_s": {"worker": s, "engine": s, "api": s},
     "load_before": "0.52 0.40 0.33", "model_thread_s": [run_s, wait_s]}

``table`` shows each configuration's mean (each repeat's in parentheses); ``paired``
divides each run by the baseline's run of the same repeat and working set, so a noisy
stretch of the machine that slows both runs of a repeat cancels out of the ratio.
"""

from __future__ import annotations

from typing import Any


def cell(runs: list[dict], key: str, fmt: str) -> str:
    """Mean of ``summary[key]`` over the runs, each run's in parentheses."""
    vals = [r["summary"][key] for r in runs if r["summary"][key] is not None]
    if not vals:
        return "-"
    mean = sum(vals) / len(vals)
    each = " / ".join(format(v, fmt) for v in vals)
    return f"{format(mean, fmt)} ({each})" if len(vals) > 1 else format(mean, fmt)


def cpu_cell(runs: list[dict], role: str) -> str:
    """Mean CPU seconds of ``role`` over the runs, each run's in parentheses."""
    vals = [r["cpu_s"][role] for r in runs]
    each = f" ({' / '.join(f'{v:.1f}' for v in vals)})" if len(vals) > 1 else ""
    return f"{sum(vals) / len(vals):.1f}{each}"


def cache_server(runs: list[dict]) -> str:
    """`` + N`` CPU seconds of a cache server of its own (LMCache's), when the runs
    had one."""
    if not all("cache_server" in r["cpu_s"] for r in runs):
        return ""
    return f" + {cpu_cell(runs, 'cache_server')}"


def stops_cell(stops: list[dict], config: str) -> str:
    """How ``config``'s servers stopped: clean ones of all, and the worst worker exit
    (seconds after the signal)."""
    mine = [s for s in stops if s["run"].split("-", 1)[1] == config]
    exits = [s["worker_exit_s"] for s in mine if s.get("worker_exit_s") is not None]
    worst = f", worker out in <= {max(exits):.1f} s" if exits else ""
    return f"{sum(s['clean'] for s in mine)}/{len(mine)} clean{worst}"


def label(ws: int | None) -> str:
    """A load's name in the tables: ``4 prompts``, or ``trace``."""
    return "trace" if ws is None else f"{ws} prompts"


def table(
    results: list[dict], working_sets: list[int], stops: list[dict], configs: tuple[str, ...]
) -> str:
    lines = [
        "| working set | config | TTFT p50 (s) | TTFT p95 (s) | cached share | "
        "req/s | errors | CPU s: worker / engine / API | load avg (1 min) | "
        "stops |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for ws in [*working_sets, None]:
        for config in configs:
            runs = [r for r in results if r["config"] == config and r["working_set"] == ws]
            if not runs:
                continue
            pct = [
                dict(
                    r,
                    summary={
                        k: (v * 100 if isinstance(v, float) else v) for k, v in r["summary"].items()
                    },
                )
                for r in runs
            ]
            lines.append(
                f"| {label(ws)} | {config} | "
                f"{cell(runs, 'ttft_p50_s', '.3f')} | "
                f"{cell(runs, 'ttft_p95_s', '.3f')} | {cell(pct, 'cached_share', '.1f')} % | "
                f"{cell(runs, 'req_per_s', '.2f')} | "
                f"{sum(r['summary']['errors'] for r in runs)} | "
                f"{' / '.join(cpu_cell(runs, k) for k in ('worker', 'engine', 'api'))}"
                f"{cache_server(runs)} | "
                f"{' / '.join(r['load_before'].split()[0] for r in runs)} | "
                f"{stops_cell(stops, config)} |"
            )
    return "\n".join(lines)


RATIOS = (("ttft_p50_s", "TTFT p50"), ("ttft_mean_s", "TTFT mean"), ("req_per_s", "req/s"))


def paired(results: list[dict], baseline: str) -> list[dict[str, Any]]:
    """For each working set and each configuration but ``baseline``: every repeat's
    ratio to the baseline's run of the same repeat and working set, by summary key
    (``RATIOS``), and the model thread's run-queue wait in both runs. A repeat without
    a baseline run (its server did not start) or with a zero or missing figure on
    either side is left out of that key's ratios."""
    base = {(r["repeat"], r["working_set"]): r for r in results if r["config"] == baseline}
    rows: dict[tuple[Any, str], dict[str, Any]] = {}
    for r in results:
        b = base.get((r["repeat"], r["working_set"]))
        if r["config"] == baseline or b is None:
            continue
        row = rows.setdefault(
            (r["working_set"], r["config"]),
            {
                "working_set": r["working_set"],
                "config": r["config"],
                "ratios": {key: [] for key, _ in RATIOS},
                "wait_s": [],
                "baseline_wait_s": [],
            },
        )
        for key, _ in RATIOS:
            mine, theirs = r["summary"].get(key), b["summary"].get(key)
            if mine is not None and theirs:
                row["ratios"][key].append(mine / theirs)
        row["wait_s"].append(r.get("model_thread_s", [0.0, 0.0])[1])
        row["baseline_wait_s"].append(b.get("model_thread_s", [0.0, 0.0])[1])
    return list(rows.values())


def paired_table(results: list[dict], baseline: str) -> str:
    """``paired``'s ratios as a table: mean, [lowest - highest], each repeat's."""
    rows = paired(results, baseline)
    if not rows:
        return ""
    head = " | ".join(f"{name} / {baseline}" for _, name in RATIOS)
    lines = [
        f"| working set | config | {head} | model thread waiting for a core (s): "
        f"config / {baseline} |",
        "|---|---|" + "---|" * (len(RATIOS) + 1),
    ]
    for row in rows:
        cells = []
        for key, _ in RATIOS:
            vals = row["ratios"][key]
            cells.append(
                "-"
                if not vals
                else f"{sum(vals) / len(vals):.3f} [{min(vals):.2f} - {max(vals):.2f}] "
                f"({' / '.join(f'{v:.2f}' for v in vals)})"
            )
        waits = (
            f"{sum(row['wait_s']) / len(row['wait_s']):.1f} / "
            f"{sum(row['baseline_wait_s']) / len(row['baseline_wait_s']):.1f}"
        )
        lines.append(
            f"| {label(row['working_set'])} | {row['config']} | {' | '.join(cells)} | {waits} |"
        )
    return "\n".join(lines)
