"""The measured side of the replay's check against a real engine (``report.realcheck``):
``scripts/loadgen_compare.py``'s loadgen result folders read back, and the engine's
costs fitted from the no-connector runs' per-request records."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flatcake.loadgen.output import REQUESTS_FILE, SUMMARY_FILE, WARMUP_FILE

CONFIGS = ("none", "flatcake")
"""The server configurations the check replays."""
MEASURED = {"cached_share": "share", "ttft_mean_s": "mean", "ttft_p50_s": "p50"}
"""loadgen's summary figures (``summary.json``) the check compares, by its own names."""
RUN_NAME = re.compile(r"^(?P<tag>.*?)-?(?P<config>[a-z]+)-ws(?P<ws>\d+)$")


@dataclass(frozen=True)
class Run:
    """One loadgen result folder."""

    name: str
    config: str
    working_set: int
    records: list[dict[str, Any]]
    """The measured requests that succeeded: those loadgen's summary counts."""
    warmup: list[dict[str, Any]]
    prompt_tokens: int
    summary: dict[str, Any]
    """loadgen's figures for ``records`` (``summary.json``'s ``summary``)."""
    load: str = "-"


@dataclass(frozen=True)
class Costs:
    """The engine's costs fitted from the no-connector runs."""

    uncached_s: float
    cached_s: float
    decode_s: float
    requests: int


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not loadgen's per-request JSON lines ({e})") from None


def load_run(folder: Path) -> Run:
    """A loadgen result folder; ``ValueError`` naming what is missing otherwise."""
    m = RUN_NAME.match(folder.name)
    summary = folder / SUMMARY_FILE
    if not summary.is_file() or not (folder / REQUESTS_FILE).is_file():
        raise ValueError(f"{folder}: not a loadgen result folder (no {SUMMARY_FILE} and "
                         f"{REQUESTS_FILE})")
    if m is None or m.group("config") not in CONFIGS:
        raise ValueError(f"{folder}: the name does not say the configuration and working "
                         f"set (<repeat>-<config>-ws<N>, config one of {', '.join(CONFIGS)})")
    try:
        doc = json.loads(summary.read_text())
        prompt_tokens = int(doc["run"]["workload_meta"]["prompt_tokens"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise ValueError(f"{summary}: not a working-set sweep's summary (no "
                         "run.workload_meta.prompt_tokens)") from None
    figures = doc.get("summary")
    if not isinstance(figures, dict) or any(figures.get(k) is None for k in MEASURED):
        raise ValueError(f"{summary}: no measured figures (summary.{', summary.'.join(MEASURED)}"
                         "; a server started without --enable-prompt-tokens-details reports "
                         "no cached tokens)")
    ok = [r for r in _jsonl(folder / REQUESTS_FILE) if _succeeded(r)]
    if not ok:
        raise ValueError(f"{folder}: no successful request recorded")
    return Run(folder.name, m.group("config"), int(m.group("ws")), ok,
               [r for r in _jsonl(folder / WARMUP_FILE) if _succeeded(r)],
               prompt_tokens, figures)


def _succeeded(record: dict[str, Any]) -> bool:
    # loadgen's own rule (``Reply.ok``), so the requests replayed are the ones its summary
    # counts: a stream that broke after its status line has status 200 and an error.
    return record.get("status") == 200 and record.get("error") is None


def load_runs(root: Path) -> list[Run]:
    """Every run under ``root`` (its ``runs/`` folder when it has one), or ``root``
    itself when it is one."""
    if not root.is_dir():
        raise ValueError(f"{root}: no such folder")
    if (root / SUMMARY_FILE).is_file():
        return [load_run(root)]
    base = root / "runs" if (root / "runs").is_dir() else root
    runs = [load_run(d) for d in sorted(base.iterdir()) if (d / SUMMARY_FILE).is_file()]
    if not runs:
        raise ValueError(f"{root}: holds no loadgen result folder")
    return [dataclasses.replace(r, load=loads.get(r.name, "-"))
            for loads in [compare_loads(base.parent / "compare.json")] for r in runs]


def compare_loads(path: Path) -> dict[str, str]:
    """Each run's load average (1 min) at its start, from ``loadgen_compare.py``'s
    ``compare.json`` when there is one."""
    try:
        results = json.loads(path.read_text())["results"]
        return {f"r{x['repeat']}-{x['config']}-ws{x['working_set']}":
                str(x["load_before"]).split()[0] for x in results}
    except (OSError, json.JSONDecodeError, KeyError, TypeError, IndexError):
        return {}


def fit_costs(runs: list[Run]) -> Costs:
    """Decode per output token (the median over requests), then prefill per uncached and
    per cached token: least squares without intercept over the lower-quartile TTFT of
    each (uncached, cached) class, less the decode step the replay adds to a prefill
    that starts while another request decodes (``replay.node.node``)."""
    parts = [part for run in runs if run.config == "none"
             for part in (run.warmup, run.records) if part]
    if not parts:
        raise ValueError("no no-connector run to fit the engine's costs from")
    decode = [(float(r["e2e_s"]) - float(r["ttft_s"])) / (int(r["completion_tokens"]) - 1)
              for part in parts for r in part if int(r.get("completion_tokens") or 0) > 1]
    step = float(np.median(decode)) if decode else 0.0
    classes: dict[tuple[int, int], list[float]] = {}
    for part in parts:
        spans = [(float(r["sent_s"]) + float(r["ttft_s"]), float(r["sent_s"]) + float(r["e2e_s"]))
                 for r in part]
        for k, r in enumerate(part):
            sent = float(r["sent_s"])
            busy = any(a <= sent < b for j, (a, b) in enumerate(spans) if j != k)
            cached = int(r["cached_tokens"] or 0)
            classes.setdefault((int(r["prompt_tokens"]) - cached, cached), []).append(
                float(r["ttft_s"]) - (step if busy else 0.0))
    keys = sorted(classes)
    a = np.array(keys, dtype=np.float64)
    b = np.array([np.percentile(classes[k], 25) for k in keys])
    if np.linalg.matrix_rank(a) < 2:
        coef = np.array([float(b.sum() / a.sum()), 0.0])
    else:
        coef = np.linalg.lstsq(a, b, rcond=None)[0]
    return Costs(max(float(coef[0]), 1e-9), max(float(coef[1]), 0.0), step,
                 sum(len(p) for p in parts))


def measured(run: Run) -> dict[str, float]:
    """The measured requests' cached share, mean and median TTFT, as loadgen's summary
    gives them."""
    return {name: float(run.summary[key]) for key, name in MEASURED.items()}
