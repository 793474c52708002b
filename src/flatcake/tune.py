"""``flatcake tune``: set the placement thresholds by replaying the user's own traffic.

The paper's advice, made a command: the write-time classification thresholds
(``[placement]``: agent context, long reply, short reply) and the spare-memory watermark
(``memory_copy_watermark``) are searched by replay on the user's trace, with the same
simulator, devices and budgets as ``flatcake replay``.

Not overfitting: the trace is split in two (``split``): by session for a session
trace (every ``1/holdout`` session, in a seeded random order), by time for a global-clock
trace (the first part tunes, the last part checks). The search sees only the tuning part;
the best configuration and the defaults are then replayed on the held-back part, and
that is the result reported.

Search: coordinate descent from the defaults. Each round tries every value of one knob
with the others held (``GRID``), keeps the best, and moves to the next knob; a round
over all knobs repeats while it improves and the budget lasts. A candidate is scored
over the rates given: mean hit rate delivered to the GPU first (a gain below
``HIT_EPSILON`` is a tie), then mean TTFT. Runs go to a process pool; the budget is in
CPU seconds of replay (each run reports its own), checked before each batch from the
mean cost so far.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flatcake import progress
from flatcake.config import FlatCakeConfig, PlacementConfig
from flatcake.replay.workload.trace import Workload, subset

if TYPE_CHECKING:
    from flatcake.replay.presets import ReplayPreset

logger = logging.getLogger(__name__)

GRID: dict[str, tuple[float, ...]] = {
    "short_reply_threshold_tokens": (0, 128, 256, 512, 1024),
    "long_reply_threshold_tokens": (1024, 2048, 4096, 8192),
    "agent_context_threshold_tokens": (8192, 16384, 32768, 65536, 131072),
    "memory_copy_watermark": (0.0, 0.5, 0.8, 0.9),
}
"""Values tried for each knob (the default is always tried too)."""

HIT_EPSILON = 1e-4
"""Hit-rate differences below this (0.01 point) are ties, decided by mean TTFT."""


@dataclass(frozen=True, slots=True)
class Score:
    """A placement replayed at every rate: mean hit rate and mean TTFT over the rates,
    and the replay CPU seconds it took."""

    hit_rate: float
    ttft_mean_s: float
    cpu_s: float

    def better_than(self, other: Score) -> bool:
        if abs(self.hit_rate - other.hit_rate) >= HIT_EPSILON:
            return self.hit_rate > other.hit_rate
        return self.ttft_mean_s < other.ttft_mean_s


@dataclass(frozen=True, slots=True)
class TuneResult:
    """What ``tune`` found.

    Attributes:
        default: the starting placement; best: the best one found on the tuning part.
        tune_default / tune_best: their scores on the tuning part.
        holdout_default / holdout_best: their scores on the held-back part.
        tried: every (placement, score) on the tuning part, in the order run.
        cpu_s: replay CPU seconds spent in all.
        budget_hit: the search stopped because the budget ran out.
    """

    default: PlacementConfig
    best: PlacementConfig
    tune_default: Score
    tune_best: Score
    holdout_default: Score
    holdout_best: Score
    tried: tuple[tuple[PlacementConfig, Score], ...]
    cpu_s: float
    budget_hit: bool


def split(wl: Workload, holdout: float = 0.5, seed: int = 0) -> tuple[Workload, Workload]:
    """(tuning part, held-back part): ``holdout`` of the sessions (seeded random choice)
    or, without sessions, the last ``holdout`` of the requests in time."""
    if not 0.0 < holdout < 1.0:
        raise ValueError(f"holdout must be in (0, 1), got {holdout!r}")
    if wl.global_clock or wl.num_sessions < 2:
        cut = np.quantile(wl.time_s, 1.0 - holdout) if wl.num_requests else 0.0
        later = wl.time_s >= cut
        return (subset(wl, ~later, f"{wl.name} (tune: first {1 - holdout:.0%})"),
                subset(wl, later, f"{wl.name} (held back: last {holdout:.0%})"))
    rng = np.random.default_rng(seed)
    ids = np.unique(wl.session)
    held = rng.permutation(ids)[:max(1, round(len(ids) * holdout))]
    back = np.isin(wl.session, held)
    return (subset(wl, ~back, f"{wl.name} (tune: {len(ids) - len(held)} sessions)"),
            subset(wl, back, f"{wl.name} (held back: {len(held)} sessions)"))


def with_config(preset: ReplayPreset, config: FlatCakeConfig) -> ReplayPreset:
    """``preset`` with FlatCake's ``[placement]`` and ``[reclaim]`` taken from ``config``
    (budgets, planner and scheduler stay the preset's)."""
    fc = dataclasses.replace(preset.flatcake, placement=config.placement,
                             reclaim=config.reclaim)
    return dataclasses.replace(preset, flatcake=fc)


REPLAY_SECTIONS = ("placement", "reclaim", "planner", "scheduler")
"""Config sections whose every key the replay's FlatCake honours."""
REPLAY_STORE_KEYS = ("release_old_windows", "release_windows_at_once", "window_rows",
                     "window_row_stride_tokens", "window_row_stride_dense_tokens")
"""The ``[store]`` keys it honours (the budgets are the preset's node)."""


def replay_config(preset: ReplayPreset, path: str) -> tuple[ReplayPreset, list[str]]:
    """``preset`` with the keys the TOML file at ``path`` sets, for every key the replay
    honours (``REPLAY_SECTIONS``, ``REPLAY_STORE_KEYS``); the keys it sets and the
    replay does not honour (the budgets, paths, the service) are returned, unapplied.
    A bad key or value raises ``ValueError`` naming it, as ``load_config`` does."""
    import tomllib

    from flatcake.config import apply_setting, load_config

    load_config(path)  # every key and value checked, with the config's own messages
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    cfg = preset.flatcake
    ignored: list[str] = []
    for section, table in data.items():
        for name, raw in (table.items() if isinstance(table, dict) else [(section, table)]):
            sect = section if isinstance(table, dict) else ""
            if sect in REPLAY_SECTIONS or (sect == "store" and name in REPLAY_STORE_KEYS):
                cfg = apply_setting(cfg, sect, name, raw)
            else:
                ignored.append(f"{sect}.{name}" if sect else name)
    return dataclasses.replace(preset, flatcake=cfg), ignored


def _replay(task: tuple[str, str, PlacementConfig, float, int]) -> tuple[float, float, float]:
    """Process-pool entry: replay one (workload file, preset, placement, rate)."""
    from flatcake.replay.presets import get_preset
    from flatcake.replay.simulate import run_replay

    path, preset_name, placement, rate, seed = task
    preset = get_preset(preset_name)
    preset = with_config(preset, dataclasses.replace(preset.flatcake, placement=placement))
    m = run_replay(Workload.load(path), "flatcake", rate, preset, seed)
    return m.hit_rate_gpu, m.ttft_mean_s, m.cpu_s


class _Runner:
    """Scores placements on one workload; remembers what it ran and the CPU it cost."""

    def __init__(self, wl: Workload, path: Path, preset: str, rates: Sequence[float],
                 seed: int, pool: ProcessPoolExecutor | None, bar: progress.Bar) -> None:
        wl.save(path)
        self.path, self.preset, self.rates, self.seed = str(path), preset, rates, seed
        self.pool, self.bar = pool, bar
        self.cpu_s = 0.0
        self.runs = 0

    def score(self, placements: Sequence[PlacementConfig]) -> list[Score]:
        tasks = [(self.path, self.preset, p, float(r), self.seed)
                 for p in placements for r in self.rates]
        mapper: Callable[..., Any] = self.pool.map if self.pool is not None else map
        out = []
        for res in mapper(_replay, tasks):
            out.append(res)
            self.bar.update(1)
        self.cpu_s += sum(c for _, _, c in out)
        self.runs += len(out)
        k = len(self.rates)
        return [Score(float(np.mean([h for h, _, _ in out[i:i + k]])),
                      float(np.mean([t for _, t, _ in out[i:i + k]])),
                      sum(c for _, _, c in out[i:i + k]))
                for i in range(0, len(out), k)]

    def cost_per_candidate(self) -> float:
        return self.cpu_s / max(self.runs, 1) * len(self.rates)


def _with(p: PlacementConfig, knob: str, value: float) -> PlacementConfig | None:
    kind = type(getattr(p, knob))
    try:
        return dataclasses.replace(p, **{knob: kind(value)})
    except ValueError:  # e.g. a short-reply threshold above the long-reply one
        return None


def tune(wl: Workload, preset: str, rates: Sequence[float], *, budget_cpu_s: float = 1000.0,
         holdout: float = 0.5, seed: int = 0, jobs: int | None = None,
         default: PlacementConfig | None = None) -> TuneResult:
    """Search the placement on one part of ``wl`` and report both parts (module doc)."""
    if not rates or any(not (r > 0 and math.isfinite(r)) for r in rates):
        raise ValueError(f"rates must be positive numbers, got {list(rates)!r}")
    if budget_cpu_s <= 0:
        raise ValueError(f"budget_cpu_s must be > 0, got {budget_cpu_s!r}")
    start = default if default is not None else PlacementConfig()
    part, held = split(wl, holdout, seed)
    jobs = max(1, jobs or os.cpu_count() or 1)
    max_runs = len(rates) * (2 + sum(len(v) for v in GRID.values()) * 2)
    bar = progress.task("tune replays", max_runs, "run")
    with tempfile.TemporaryDirectory(prefix="flatcake-tune-") as tmp, \
            ProcessPoolExecutor(jobs) if jobs > 1 else _NoPool() as pool:
        runner = _Runner(part, Path(tmp) / "tune.npz", preset, rates, seed, pool, bar)
        tried: list[tuple[PlacementConfig, Score]] = []
        seen = {start}
        best, [best_score] = start, runner.score([start])
        tried.append((start, best_score))
        default_score = best_score
        budget_hit = False
        improved = True
        while improved and not budget_hit:
            improved = False
            for knob, values in GRID.items():
                cands = [c for v in values if (c := _with(best, knob, v)) is not None
                         and c not in seen]
                if not cands:
                    continue
                # Keep room for the held-back check (two candidates).
                if runner.cpu_s + runner.cost_per_candidate() * (len(cands) + 2) \
                        > budget_cpu_s:
                    budget_hit = True
                    break
                seen.update(cands)
                for c, s in zip(cands, runner.score(cands), strict=True):
                    tried.append((c, s))
                    if s.better_than(best_score):
                        best, best_score, improved = c, s, True
        check = _Runner(held, Path(tmp) / "held.npz", preset, rates, seed, pool, bar)
        held_default, held_best = check.score([start, best]) if best != start else \
            2 * check.score([start])
    bar.close()
    return TuneResult(start, best, default_score, best_score, held_default, held_best,
                      tuple(tried), runner.cpu_s + check.cpu_s, budget_hit)


class _NoPool:
    """Stands in for the pool with one job: runs in this process."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def toml_snippet(p: PlacementConfig) -> str:
    """The ``[placement]`` section for a config file (store, connector, replay)."""
    lines = ["[placement]"]
    for f in dataclasses.fields(p):
        v = getattr(p, f.name)
        # TOML spells booleans in lower case; numbers read the same as Python's repr.
        lines.append(f"{f.name} = {str(v).lower() if isinstance(v, bool) else repr(v)}")
    return "\n".join(lines)
