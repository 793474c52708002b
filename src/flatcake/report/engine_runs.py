"""The measured side of the replay's check against a real engine (``report.realcheck``):
``scripts/loadgen_compare.py``'s loadgen result folders read back (working-set sweeps
``<repeat>-<config>-ws<N>`` and trace replays ``<repeat>-<config>-trace``, each with its
server's log beside them), and the engine's costs fitted from the no-connector runs'
per-request records."""

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
RUN_NAME = re.compile(r"^(?P<tag>.*?)-?(?P<config>[a-z]+)-(?:ws(?P<ws>\d+)|trace)$")
WS_SESSION = re.compile(r"^ws-(\d+)(?:-s\d+)?$")


@dataclass(frozen=True)
class Run:
    """One loadgen result folder."""

    name: str
    config: str
    working_set: int | None
    """None: a trace replay."""
    records: list[dict[str, Any]]
    """The measured requests that succeeded: those loadgen's summary counts."""
    warmup: list[dict[str, Any]]
    summary: dict[str, Any]
    """loadgen's figures for ``records`` (``summary.json``'s ``summary``)."""
    block_tokens: int
    """Tokens per block id of the records' ``blocks`` (loadgen's, not the engine's)."""
    log: Path | None = None
    """The server's log, when the run sits in a ``loadgen_compare`` folder."""
    load: str = "-"
    stretch: float | None = None
    """Wall seconds per CPU second of the engine's model thread during the run: 1 + the
    seconds it waited for a core per second it ran (``compare.json``'s
    ``model_thread_s``); None when not measured."""
    worker_cpu_s: float | None = None
    """CPU seconds of all the engine worker's threads during the run (the model's, and
    with FlatCake its connector's); None when not measured."""

    @property
    def workload(self) -> str:
        return "trace" if self.working_set is None else f"{self.working_set} prompts"


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
        raise ValueError(f"{folder}: the name does not say the configuration and workload "
                         f"(<repeat>-<config>-ws<N> or <repeat>-<config>-trace, config one "
                         f"of {', '.join(CONFIGS)})")
    try:
        doc = json.loads(summary.read_text())
        run = doc["run"]
        block_tokens = int(run.get("block_tokens") or run["workload_meta"]["prompt_tokens"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise ValueError(f"{summary}: not loadgen's summary (no run.block_tokens)") from None
    figures = doc.get("summary")
    if not isinstance(figures, dict) or any(figures.get(k) is None for k in MEASURED):
        raise ValueError(f"{summary}: no measured figures (summary.{', summary.'.join(MEASURED)}"
                         "; a server started without --enable-prompt-tokens-details reports "
                         "no cached tokens)")
    ok = [r for r in _jsonl(folder / REQUESTS_FILE) if _succeeded(r)]
    if not ok:
        raise ValueError(f"{folder}: no successful request recorded")
    warm = [r for r in _jsonl(folder / WARMUP_FILE) if _succeeded(r)]
    for r in (*warm, *ok):
        if "blocks" not in r:  # recorded before loadgen wrote them: a working set's
            v = WS_SESSION.match(str(r.get("session_id", "")))  # visit names its prompt
            if v is None:
                raise ValueError(f"{folder}: request {r.get('index')} records no prompt "
                                 f"blocks and is not a working-set visit (session "
                                 f"{r.get('session_id')!r})")
            r["blocks"] = [[int(v.group(1)), int(v.group(1)) + 1]]
    log = folder.parent.parent / f"server-{m.group('tag')}-{m.group('config')}.log"
    ws = m.group("ws")
    return Run(folder.name, m.group("config"), int(ws) if ws else None, ok, warm, figures,
               block_tokens, log if log.is_file() else None)


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
    seen = compare_results(base.parent / "compare.json")
    return [dataclasses.replace(r, **seen[r.name]) if r.name in seen else r for r in runs]


def compare_results(path: Path) -> dict[str, dict[str, Any]]:
    """Each run's load average (1 min) at its start, its engine's stretch and worker CPU
    (``Run.stretch``, ``Run.worker_cpu_s``: ``model_thread_s``, ``cpu_s``), from
    ``loadgen_compare.py``'s ``compare.json`` when there is one."""
    try:
        results = json.loads(path.read_text())["results"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return {}
    got: dict[str, dict[str, Any]] = {}
    for x in results:
        try:
            name = f"r{x['repeat']}-{x['config']}-" + (
                "trace" if x["working_set"] is None else f"ws{x['working_set']}")
            run, wait = (x.get("model_thread_s") or [0, 0])[:2]
            cpu = (x.get("cpu_s") or {}).get("worker")
            got[name] = {"load": str(x["load_before"]).split()[0],
                         "stretch": 1 + float(wait) / float(run) if float(run) > 0 else None,
                         "worker_cpu_s": float(cpu) if cpu is not None else None}
        except (KeyError, TypeError, IndexError, ValueError, AttributeError):
            continue
    return got


def fit_costs(runs: list[Run]) -> Costs:
    """Decode per output token (the median over requests), then prefill per uncached and
    per cached token: least squares without intercept over the lower-quartile TTFT of
    each (uncached, cached) class, less the decode step the replay adds to a prefill
    that starts while another request decodes (``replay.node.node``). Each run's times
    are divided by its ``stretch`` where measured: the costs of an engine that has its
    core to itself."""
    parts = [(part, run.stretch or 1.0) for run in runs if run.config == "none"
             for part in (run.warmup, run.records) if part]
    if not parts:
        raise ValueError("no no-connector run to fit the engine's costs from")
    decode = [(float(r["e2e_s"]) - float(r["ttft_s"])) / (int(r["completion_tokens"]) - 1)
              / f for part, f in parts for r in part
              if int(r.get("completion_tokens") or 0) > 1]
    step = float(np.median(decode)) if decode else 0.0
    classes: dict[tuple[int, int], list[float]] = {}
    for part, f in parts:
        spans = [(float(r["sent_s"]) + float(r["ttft_s"]), float(r["sent_s"]) + float(r["e2e_s"]))
                 for r in part]
        for k, r in enumerate(part):
            sent = float(r["sent_s"])
            busy = any(a <= sent < b for j, (a, b) in enumerate(spans) if j != k)
            cached = int(r["cached_tokens"] or 0)
            classes.setdefault((int(r["prompt_tokens"]) - cached, cached), []).append(
                float(r["ttft_s"]) / f - (step if busy else 0.0))
    keys = sorted(classes)
    a = np.array(keys, dtype=np.float64)
    b = np.array([np.percentile(classes[k], 25) for k in keys])
    if np.linalg.matrix_rank(a) < 2:
        coef = np.array([float(b.sum() / a.sum()), 0.0])
    else:
        coef = np.linalg.lstsq(a, b, rcond=None)[0]
    return Costs(max(float(coef[0]), 1e-9), max(float(coef[1]), 0.0), step,
                 sum(len(p) for p, _ in parts))


def measured(run: Run) -> dict[str, float]:
    """The measured requests' cached share, mean and median TTFT, as loadgen's summary
    gives them."""
    return {name: float(run.summary[key]) for key, name in MEASURED.items()}
