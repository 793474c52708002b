"""The report's sliding-window comparison: the Claude Code trace on the ``paper`` preset
with DeepSeek-V4's sliding windows left to the engine (vLLM's bounded replay, the
published table) beside the same sweep with the windows prefix-cached
(``NodeSpec.uncached_kinds=()``, vLLM 0.32's DeepSeek-V4 model class), where FlatCake
stores each turn's window and cuts hits back to it, and each baseline stores and reads
the window by the rule of the engine it models (``replay.systems.layers.PeerBlocks``:
SGLang's trailing window per request for the HiCache baselines, vLLM's every block for
``tiered-direct``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from flatcake.replay.results import SweepResult
from flatcake.replay.sweep import run_sweep

NAME = "claude-code-window"
"""The sweep's folder in the report's ``--out`` (part of the ``claude-code`` step)."""

CACHED = (("uncached_kinds", ()),)
"""The preset override: every layer kind prefix-cached, the sliding windows included."""


def run(wl: Any, systems: list[str], rates: list[float], out: Path,
        jobs: int | None) -> SweepResult:
    """The Claude Code sweep with the sliding windows prefix-cached."""
    return run_sweep(wl, systems, rates, "paper", out, jobs=jobs, preset_overrides=CACHED,
                     plots=False, meta={"note": "paper preset, sliding windows "
                                        "prefix-cached (uncached_kinds=())"})


def _num(v: Any, pattern: str) -> str:
    return pattern.format(v) if isinstance(v, int | float) and math.isfinite(v) else "–"


def _restore_commands(run: dict[str, Any]) -> str:
    cmds = (run.get("extra") or {}).get("restore_commands_by_kind")
    return f"{sum(cmds.values()):,.1f}" if cmds else "–"


def windows_table(rebuilt: SweepResult, cached: SweepResult) -> list[str]:
    """Per system and rate in both sweeps: hit rate, mean TTFT, read amplification and
    SSD read commands per restore, windows rebuilt by the engine against windows
    prefix-cached."""
    rows = []
    for s in cached.meta["systems"]:
        for c in cached.by(s):
            b = next((r for r in rebuilt.by(s) if r["rate_req_s"] == c["rate_req_s"]), None)
            if b is None:
                continue
            rows.append(
                f"| {s} | {c['rate_req_s']:g} | {100 * b['hit_rate_gpu']:.2f} | "
                f"{100 * c['hit_rate_gpu']:.2f} | {b['ttft_mean_s']:.3f} | "
                f"{c['ttft_mean_s']:.3f} | {_num(b['read_amplification'], '{:.2f}')} | "
                f"{_num(c['read_amplification'], '{:.2f}')} | {_restore_commands(b)} | "
                f"{_restore_commands(c)} |")
    if not rows:
        return []
    bound = cached.runs[0]["max_hit_rate"] if cached.runs else float("nan")
    return ["## Sliding windows rebuilt by vLLM or prefix-cached (Claude Code, `paper`)", "",
            "Each pair: DeepSeek-V4's sliding windows left to the engine (vLLM's bounded "
            "replay, the tables above) / prefix-cached (vLLM 0.32's DeepSeek-V4 model "
            "class, `uncached_kinds=()`). Prefix-cached, FlatCake stores each turn's "
            "window and cuts a hit back to where the window is held. The HiCache "
            "baselines (tiered, tiered-wait, memory-only) keep one trailing window per "
            "request and cut a hit back to a prefix whose window is held, as SGLang "
            "0.5.23 does; tiered-direct stores every block's windowed layers, as vLLM's "
            "OffloadingConnector does; both read the window at the hit's end. The "
            "compressor states are windows the engine prefix-caches in both columns. SSD "
            "read commands per restore: every layer kind together (tiered: one per "
            f"object). The bound is {100 * bound:.2f}%.", "",
            "| system | rate | hit rate (%) rebuilt | prefix-cached | mean TTFT (s) "
            "rebuilt | prefix-cached | read amplification rebuilt | prefix-cached | "
            "commands per restore rebuilt | prefix-cached |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows, ""]
