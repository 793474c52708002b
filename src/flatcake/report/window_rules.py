"""The report's window-rule comparison (``store.window_rows``): FlatCake on the ``paper``
preset (DeepSeek-V4-Flash's per-layer caches) with each rule for where a turn keeps its
sliding-window rows, beside ``tiered-direct`` (vLLM's every-block rule), on the Mooncake
conversation trace and the Claude Code trace at 1 req/s: delivered hit rate, mean TTFT
and the SSD bytes each rule writes of the windowed kinds, against the newest-turn-only
rule and against every block of the turns the run stored.

    newest turn only   turn ends, older turns' rows released as soon as a newer turn is
                       durable (``store.release_windows_at_once``)
    turn ends          every turn's end, superseded rows kept while the SSD has room
    branches           turn ends and where prompts branch off (one window a branch)
    + stride 1K / 2K   and every 1,024 (the default) / 2,048 prompt tokens
                       (``store.window_row_stride_tokens``)
    every block        rows at every block
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

NAME = "window-rules"
"""The step's folder in the report's ``--out``."""

RULES: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = (
    ("newest turn only", (("window_rows", "turn-ends"), ("window_row_stride_tokens", 0),
                          ("release_windows_at_once", True))),
    ("turn ends", (("window_rows", "turn-ends"), ("window_row_stride_tokens", 0))),
    ("branches", (("window_rows", "branches"), ("window_row_stride_tokens", 0))),
    ("branches + stride 1K (default)", (("window_rows", "branches"),
                                        ("window_row_stride_tokens", 1024))),
    ("branches + stride 2K", (("window_rows", "branches"), ("window_row_stride_tokens", 2048))),
    ("every block", (("window_rows", "every-block"),)),
)
RATE = 1.0


def window_bytes(extra: dict[str, Any], windowed: set[str]) -> tuple[int | None, int | None]:
    """From a run's ``extra`` metrics: the SSD bytes written of the ``windowed`` kinds,
    and what the same segments would hold with a window row at every block (written plus
    ``ssd_saved_by_windows_bytes``); None where the system does not count its writes per
    layer kind. (The every-block rule replayed is no such count: a turn its rows would
    push past a session file's span keeps its end's window only.)"""
    by_kind = extra.get("ssd_written_bytes_by_kind") or {}
    if not by_kind:
        return None, None
    window = sum(v for k, v in by_kind.items() if k in windowed)
    saved = extra.get("ssd_saved_by_windows_bytes")
    return window, None if saved is None else window + saved


def _one(task: tuple[str, str, str, tuple[tuple[str, Any], ...]]) -> dict[str, Any]:
    """Process-pool entry: one replay of ``(trace, system, rule name, store keys)``."""
    import dataclasses

    from flatcake.config import apply_setting
    from flatcake.replay.presets import get_preset
    from flatcake.replay.simulate import run_replay
    from flatcake.replay.workload.source import load_workload

    trace, system, rule, keys = task
    preset = get_preset("paper")
    cfg = preset.flatcake
    for name, value in keys:
        cfg = apply_setting(cfg, "store", name, value)
    preset = dataclasses.replace(preset, flatcake=cfg)
    m = run_replay(load_workload(trace)[0], system, RATE, preset).to_dict()
    windowed = {g.kind for g in preset.geometry.layer_groups if g.window_tokens}
    window, every = window_bytes(m.get("extra") or {}, windowed)
    return {"trace": Path(trace).name, "system": system, "rule": rule,
            "hit_rate": m["hit_rate_gpu"], "bound": m["max_hit_rate"],
            "ttft_mean_s": m["ttft_mean_s"], "ssd_write_bytes": m["ssd_write_bytes"],
            "window_write_bytes": window, "window_every_block_bytes": every}


def run(traces: list[str], out: Path, jobs: int | None,
        progress: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Every rule and ``tiered-direct`` on each trace; saved as ``rules.json``."""
    tasks = [(t, "flatcake", rule, keys) for t in traces for rule, keys in RULES]
    tasks += [(t, "tiered-direct", "every block", ()) for t in traces]
    with ProcessPoolExecutor(max_workers=max(1, jobs or 1)) as pool:
        rows = []
        for row in pool.map(_one, tasks):
            progress(f"window rules: {row['trace']} {row['system']} {row['rule']}: "
                     f"{100 * row['hit_rate']:.2f} %")
            rows.append(row)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rules.json").write_text(json.dumps(rows, indent=1))
    return rows


def load(out: Path) -> list[dict[str, Any]] | None:
    """The rows a previous run saved, or None."""
    path = out / "rules.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _ratio(num: int | None, den: int | None) -> str:
    return f"{num / den:.3f}" if num is not None and den else "–"


def rules_table(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown: per trace, each rule's hit rate, mean TTFT and window bytes written,
    against FlatCake's newest-turn-only rule on the same trace and against the same
    run's segments with a row at every block ("–" for a system that does not count its
    writes per layer kind, or a row saved before the every-block count was kept)."""
    out = ["## Where a turn keeps its window rows (`store.window_rows`)", "",
           f"FlatCake with each rule and tiered-direct, preset `paper`, {RATE:g} req/s. "
           "Window bytes: SSD bytes written of the sliding-window kinds; x newest turn: "
           "against FlatCake's newest-turn-only rule on the same trace; x every block: "
           "against the same run's segments with a window row at every block (written "
           "plus what the rule saved; the every-block rule replayed keeps only its end's "
           "window in a turn its rows would push past a session file's span).", "",
           "| trace | system | rule | hit % (bound) | mean TTFT s | SSD written TB | "
           "window TB | x newest turn | x every block |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for trace in dict.fromkeys(r["trace"] for r in rows):
        mine = [r for r in rows if r["trace"] == trace]
        newest = next((r["window_write_bytes"] for r in mine if r["system"] == "flatcake"
                       and r["rule"] == "newest turn only"), None)
        for r in mine:
            win = r["window_write_bytes"]
            out.append(f"| {trace} | {r['system']} | {r['rule']} | "
                       f"{100 * r['hit_rate']:.2f} ({100 * r['bound']:.2f}) | "
                       f"{r['ttft_mean_s']:.3f} | {r['ssd_write_bytes'] / 1e12:.2f} | "
                       f"{'–' if win is None else f'{win / 1e12:.3f}'} | "
                       f"{_ratio(win, newest)} | "
                       f"{_ratio(win, r.get('window_every_block_bytes'))} |")
    return [*out, ""]
