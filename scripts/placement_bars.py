"""The placement bars of issue 10, measured with the replay: one table, one verdict per row.

    PYTHONPATH=src python scripts/placement_bars.py --out DIR [--only CASES] [--config TOML]

Cases (``--only``, comma list; default all):

* ``mooncake``: the Mooncake conversation trace (chat), preset ``paper``, 1 / 4 / 8 req/s;
* ``chat``, ``mixed``: the built-in workloads of ``make demo``, the preset's rates;
* bar for these three: FlatCake's hit rate >= tiered's and >= tiered-direct's minus
  0.05 pt, its mean TTFT <= each of theirs x 1.02;
* ``cc``: the Claude Code trace, preset ``paper``; bar: hit rate within 0.1 pt of the
  infinite-cache bound at every rate;
* ``llama16``, ``llama64``: the built-in agent workload (64 sessions) capped at 16K / 64K
  tokens, preset ``llama70b``; bar: FlatCake's mean TTFT <= tiered-direct's.

Each run is one process after the other (the replay is deterministic: seed 0); a case's
runs are kept in ``DIR/<case>.jsonl`` and reused when the file exists. ``--config``:
a FlatCake TOML whose [placement] and [reclaim] replace the presets' (flatcake only).
Prints the table in Markdown and the CPU seconds of the runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from flatcake.replay.presets import get_preset
from flatcake.replay.simulate import run_replay
from flatcake.replay.workload.source import load_workload

CLAUDE_CODE = "../shared/traces/weka-claude-code/weka_claude_code_traces.jsonl.gz"
MOONCAKE = "../shared/traces/mooncake-fast25/conversation_trace.jsonl"
PEERS = ("flatcake", "tiered", "tiered-direct")
CASES: dict[str, tuple[str, tuple[str, ...], tuple[float, ...] | None]] = {
    "mooncake": ("paper", PEERS, (1.0, 4.0, 8.0)),
    "chat": ("paper", PEERS, None),
    "mixed": ("paper", PEERS, None),
    "cc": ("paper", ("flatcake",), None),
    "llama16": ("llama70b", ("flatcake", "tiered-direct"), None),
    "llama64": ("llama70b", ("flatcake", "tiered-direct"), None),
}


def workload(case: str, block_tokens: int) -> Any:
    if case == "mooncake":
        return load_workload(MOONCAKE)[0]
    if case == "cc":
        return load_workload(CLAUDE_CODE)[0]
    if case.startswith("llama"):
        ctx = 16384 if case == "llama16" else 65536
        return load_workload(None, sessions=64, block_tokens=block_tokens,
                             context_tokens=ctx)[0]
    return load_workload(None, kind=case)[0]


def run_case(case: str, out: Path, config: str | None) -> list[dict[str, Any]]:
    path = out / f"{case}.jsonl"
    if path.is_file():
        return [json.loads(line) for line in path.read_text().splitlines() if line]
    preset_name, systems, rates = CASES[case]
    preset = get_preset(preset_name)
    wl = workload(case, preset.builtin_block_tokens)
    tuned = preset
    if config:
        from flatcake.config import load_config
        from flatcake.tune import with_config
        tuned = with_config(preset, load_config(config))
    rows = []
    for rate in rates or preset.rates:
        for system in systems:
            m = run_replay(wl, system, rate, tuned if system == "flatcake" else preset)
            rows.append({"system": system, "rate": rate, "hit": m.hit_rate_gpu,
                         "max_hit": m.max_hit_rate, "ttft": m.ttft_mean_s, "cpu_s": m.cpu_s,
                         "restores": m.num_restores, "ssd_read_bytes": m.ssd_read_bytes})
            print(f"{case} {system} {rate:g}: hit {100 * m.hit_rate_gpu:.4f}% "
                  f"ttft {m.ttft_mean_s:.5f} s ({m.cpu_s:.1f} CPU s)", file=sys.stderr)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def verdicts(case: str, rows: list[dict[str, Any]]) -> list[str]:
    """One Markdown row per rate: FlatCake against the case's bar."""
    out = []
    for rate in sorted({r["rate"] for r in rows}):
        at = {r["system"]: r for r in rows if r["rate"] == rate}
        fc = at["flatcake"]
        hit, ttft = 100 * fc["hit"], fc["ttft"]
        if case == "cc":
            gap = 100 * (fc["max_hit"] - fc["hit"])
            out.append(f"| {case} | {rate:g} | {hit:.4f} | bound {100 * fc['max_hit']:.4f}"
                       f" | {ttft:.4f} | – | {'met' if gap <= 0.1 else 'NOT met'}"
                       f" ({gap:.4f} pt below) |")
            continue
        peers = [s for s in at if s != "flatcake"]
        if case.startswith("llama"):
            ok = ttft <= at["tiered-direct"]["ttft"]
        else:
            ok = hit >= 100 * at["tiered"]["hit"] and \
                hit >= 100 * at["tiered-direct"]["hit"] - 0.05 and \
                all(ttft <= at[s]["ttft"] * 1.02 for s in peers)
        others_hit = " / ".join(f"{100 * at[s]['hit']:.4f}" for s in peers)
        others_ttft = " / ".join(f"{at[s]['ttft']:.4f} ({100 * (ttft / at[s]['ttft'] - 1):+.2f}%)"
                                 for s in peers)
        out.append(f"| {case} | {rate:g} | {hit:.4f} | {others_hit} | {ttft:.4f} | "
                   f"{others_ttft} | {'met' if ok else 'NOT met'} |")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--only", default=",".join(CASES))
    p.add_argument("--config", default=None)
    args = p.parse_args(argv)
    cases = [c for c in args.only.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        p.error(f"unknown cases {unknown}; choose from {sorted(CASES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    lines = ["| case | rate | flatcake hit (%) | peers' hit (%) (tiered / tiered-direct) | "
             "flatcake TTFT (s) | peers' TTFT (s) | bar |", "|---|---:|---:|---:|---:|---:|---|"]
    cpu = 0.0
    for case in cases:
        rows = run_case(case, args.out, args.config)
        cpu += sum(r["cpu_s"] for r in rows)
        lines += verdicts(case, rows)
    print("\n".join(lines))
    print(f"\nreplay CPU seconds of these runs: {cpu:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
