"""What a replay run measures, and the per-run summary every table and plot uses.

Definitions (all over the whole run):

* ``hit_rate_gpu``: input blocks present in GPU memory when their request's prefill
  starts (prefix-cache hits plus blocks restored or loaded in time), over all input
  blocks. Blocks stored somewhere but not in the GPU in time count as misses.
* ``max_hit_rate``: the same ratio for an infinite cache: each request's longest run of
  blocks already seen by an earlier request of the replay.
* ``max_hit_rate_turn_ends``: the infinite-cache bound when a sliding window the engine
  prefix-caches is held only at turn ends: each request's longest seen run cut back to
  the last position where an earlier request's full blocks ended (a store that keeps a
  window at every block reaches ``max_hit_rate``; one that keeps it at turn ends, at
  most this). Equal to ``max_hit_rate`` for a model without such a window.
* ``ttft_*``: arrival to first token (queueing, restore, prefill).
* ``throughput_req_s`` / ``throughput_tokens_s``: requests and (input + output) tokens
  finished per second in the steady window between the 10th and the 90th percentile of
  arrival times (a finite trace ramps up and drains; long sessions make the drain long).
  ``throughput_req_s`` is the *delivered* request rate.
* ``offered_req_s``: the rate the arrival model offers in the same window (an ideal,
  unloaded node; ``replay.node.arrivals``). ``load_status``: ``ok`` when the delivered rate is
  within 5% of the requested one, ``saturated`` when the arrival model offered it but
  the node delivered less (requests waited, so chains sent their next turns later),
  ``unreachable`` when the trace cannot offer it at all.
* ``gpu_busy_frac`` / ``ssd_busy_frac``: mean over workers of the time its GPU was
  prefilling or decoding / its SSD channel was reading or writing, over the run's span.
* ``queue_mean`` / ``queue_p99``: time-weighted mean and 99th percentile of a worker's
  queue (requests arrived at it that have not started their prefill), all workers.
* ``ssd_read_gbps_per_worker``: SSD bytes read over the seconds a worker's SSD channel
  spent reading them (the bandwidth a restore sees), in GB/s.
* ``read_amplification``: SSD bytes read per byte delivered by completed SSD restores
  (alignment, read-through gaps, whole objects, and reads of prefetches that did not
  complete all count).
* ``read_commands``: SSD read commands issued.
* ``prefetch_time_*``: for requests whose SSD restore completed, arrival to restore
  end (waiting for a restore slot or the device included).
* ``prefetch_cancellations``: SSD prefetches that did not deliver every block they could
  (``tiered``: refused by the prefetch budget, truncated to the host pool, or terminated
  when the request was scheduled; causes in ``extra``), so the rest of
  tokens were recomputed.
* ``recomputed_tokens``: tokens prefilled although an infinite cache would have held
  them (the cost of every miss below ``max_hit_rate``).
* ``ssd_write_bytes`` / ``ssd_read_bytes``: bytes written to / read back from the SSD.
  ``ssd_never_read_bytes`` (FlatCake; ``None`` for a system whose books do not say):
  bytes of SSD segments no restore read before the run ended or reclaim dropped them
  (``control.wear``). ``drive_writes_per_day``: the bytes written per day of the run's
  span over ``drive_bytes`` (``--drive-tb``, default ``DEFAULT_DRIVE_BYTES``): the
  endurance rating a drive of that size would need at this rate.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from flatcake.replay.node.occupancy import LevelTracker, level_stats

SATURATION_SLACK = 0.05
"""Delivered more than this fraction below requested counts as saturation."""

DEFAULT_DRIVE_BYTES = 4 * 10**12
"""The drive ``drive_writes_per_day`` is stated for: a 4 TB data-centre NVMe."""


class Recorder:
    """Per-request columns and counters filled during a run (simulator thread only)."""

    def __init__(self, num_requests: int, num_workers: int) -> None:
        n = num_requests
        self.num_workers = num_workers
        self.arrival_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.done_s = np.full(n, np.nan)
        self.num_blocks = np.zeros(n, dtype=np.int64)
        self.hit_blocks = np.zeros(n, dtype=np.int64)
        self.max_hit_blocks = np.zeros(n, dtype=np.int64)
        self.turn_end_hit_blocks = np.zeros(n, dtype=np.int64)
        self.prefetch_s: list[float] = []
        self.ssd_read_bytes = 0
        self.ssd_read_busy_s = 0.0
        self.ssd_read_commands = 0
        self.ssd_useful_bytes = 0  # delivered by completed SSD restores
        self.ssd_write_bytes = 0
        self.ssd_write_commands = 0
        self.prefetch_cancellations = 0
        self.recomputed_tokens = 0
        self.prefill_tokens = 0
        self.gpu_evicted_blocks = 0
        self.num_events = 0
        self.link_busy_s: list[float] = []
        self.gpu_busy_s: list[float] = []
        self.ssd_busy_s: list[float] = []
        self.queues: list[LevelTracker] = []
        self.offered_req_s = math.nan
        self.offer_unreachable = False

    def ssd_read(self, num_commands: int, num_bytes: int, busy_s: float) -> None:
        self.ssd_read_commands += num_commands
        self.ssd_read_bytes += num_bytes
        self.ssd_read_busy_s += busy_s

    def ssd_write(self, num_commands: int, num_bytes: int) -> None:
        self.ssd_write_commands += num_commands
        self.ssd_write_bytes += num_bytes


def drive_writes_per_day(written_bytes: float, span_s: float, drive_bytes: int) -> float:
    """``written_bytes`` over ``span_s`` seconds, as whole drives of ``drive_bytes`` a day."""
    if span_s <= 0 or drive_bytes <= 0:
        return math.nan
    return written_bytes / drive_bytes / (span_s / 86400.0)


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if len(a) else math.nan


@dataclass(frozen=True, slots=True)
class RunMetrics:
    """One (system, rate) run. Field names are the metric names ``--json`` prints."""

    system: str
    rate_req_s: float
    preset: str
    trace: str
    seed: int
    num_requests: int
    hit_rate_gpu: float
    max_hit_rate: float
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    throughput_req_s: float
    throughput_tokens_s: float
    offered_req_s: float
    load_status: str
    gpu_busy_frac: float
    ssd_busy_frac: float
    queue_mean: float
    queue_p99: float
    ssd_read_gbps_per_worker: float
    read_amplification: float
    read_commands: int
    prefetch_time_mean_s: float
    prefetch_time_p99_s: float
    prefetch_cancellations: int
    recomputed_tokens: int
    placements: dict[str, int] = field(default_factory=dict)
    ssd_read_bytes: int = 0
    ssd_write_bytes: int = 0
    num_restores: int = 0
    simulated_s: float = 0.0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    max_hit_rate_turn_ends: float = math.nan
    ssd_never_read_bytes: float = math.nan
    drive_bytes: int = DEFAULT_DRIVE_BYTES

    @property
    def drive_writes_per_day(self) -> float:
        """SSD bytes written per day of the run's span, in drives of ``drive_bytes``."""
        return drive_writes_per_day(self.ssd_write_bytes, self.simulated_s, self.drive_bytes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["drive_writes_per_day"] = self.drive_writes_per_day
        for k, v in list(d.items()):
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = None
        return d


def summarize(rec: Recorder, *, system: str, rate_req_s: float, preset: str, trace: str,
              seed: int, input_tokens: np.ndarray, output_tokens: np.ndarray,
              placements: dict[str, int] | None = None, wall_s: float = 0.0,
              cpu_s: float = 0.0, extra: dict[str, Any] | None = None,
              ssd_never_read_bytes: float = math.nan) -> RunMetrics:
    """Reduce a finished run's recorder to its ``RunMetrics``."""
    total_blocks = int(rec.num_blocks.sum())
    ttft = rec.first_token_s - rec.arrival_s
    t0 = float(np.nanmin(rec.arrival_s)) if len(ttft) else 0.0
    t1 = float(np.nanmax(rec.done_s)) if len(ttft) else 0.0
    span = max(t1 - t0, 1e-12)
    if len(ttft) >= 10:
        w0, w1 = np.percentile(rec.arrival_s, [10, 90])
    else:
        w0, w1 = t0, t1
    window = max(float(w1 - w0), 1e-12)
    in_win = (rec.done_s >= w0) & (rec.done_s < w1)
    win_reqs = int(np.count_nonzero(in_win))
    win_tokens = float(input_tokens[in_win].sum() + output_tokens[in_win].sum())
    pf = np.asarray(rec.prefetch_s)
    n = len(ttft)
    delivered = win_reqs / window
    if rec.offer_unreachable or rec.offered_req_s < rate_req_s * (1 - SATURATION_SLACK):
        status = "unreachable"
    elif delivered < rate_req_s * (1 - SATURATION_SLACK):
        status = "saturated"
    else:
        status = "ok"
    workers = max(rec.num_workers, 1)
    q_mean, q_p99 = level_stats(rec.queues) if rec.queues else (math.nan, math.nan)
    return RunMetrics(
        system=system,
        rate_req_s=rate_req_s,
        preset=preset,
        trace=trace,
        seed=seed,
        num_requests=n,
        hit_rate_gpu=float(rec.hit_blocks.sum()) / total_blocks if total_blocks else math.nan,
        max_hit_rate=(float(rec.max_hit_blocks.sum()) / total_blocks if total_blocks
                      else math.nan),
        max_hit_rate_turn_ends=(float(rec.turn_end_hit_blocks.sum()) / total_blocks
                                if total_blocks else math.nan),
        ttft_mean_s=float(np.mean(ttft)) if n else math.nan,
        ttft_p50_s=_pct(ttft, 50),
        ttft_p99_s=_pct(ttft, 99),
        throughput_req_s=delivered,
        throughput_tokens_s=win_tokens / window,
        offered_req_s=rec.offered_req_s,
        load_status=status,
        gpu_busy_frac=sum(rec.gpu_busy_s) / workers / span if rec.gpu_busy_s else math.nan,
        ssd_busy_frac=sum(rec.ssd_busy_s) / workers / span if rec.ssd_busy_s else math.nan,
        queue_mean=q_mean,
        queue_p99=q_p99,
        ssd_read_gbps_per_worker=(rec.ssd_read_bytes / rec.ssd_read_busy_s / 1e9
                                  if rec.ssd_read_busy_s > 0 else math.nan),
        read_amplification=(rec.ssd_read_bytes / rec.ssd_useful_bytes
                            if rec.ssd_useful_bytes else math.nan),
        read_commands=rec.ssd_read_commands,
        prefetch_time_mean_s=float(pf.mean()) if len(pf) else math.nan,
        prefetch_time_p99_s=_pct(pf, 99),
        prefetch_cancellations=rec.prefetch_cancellations,
        recomputed_tokens=rec.recomputed_tokens,
        placements=dict(placements or {}),
        ssd_read_bytes=rec.ssd_read_bytes,
        ssd_write_bytes=rec.ssd_write_bytes,
        num_restores=len(pf),
        simulated_s=span,
        wall_s=wall_s,
        cpu_s=cpu_s,
        extra=dict(extra or {}),
        ssd_never_read_bytes=ssd_never_read_bytes,
    )


METRIC_COLUMNS: tuple[str, ...] = (
    "system", "rate_req_s", "hit_rate_gpu", "max_hit_rate", "ttft_mean_s", "ttft_p50_s",
    "ttft_p99_s", "offered_req_s", "throughput_req_s", "load_status", "gpu_busy_frac",
    "ssd_busy_frac", "queue_mean", "queue_p99", "throughput_tokens_s",
    "ssd_read_gbps_per_worker",
    "read_amplification", "read_commands", "prefetch_time_mean_s", "prefetch_time_p99_s",
    "prefetch_cancellations", "recomputed_tokens", "ssd_write_bytes", "ssd_read_bytes",
    "ssd_never_read_bytes", "drive_writes_per_day",
)
"""Columns of the sweep tables, in order (placement counts follow)."""


def format_wear(m: RunMetrics) -> str:
    """One line: SSD written, read back, written and never read, drive-writes per day."""
    never = m.ssd_never_read_bytes
    unread = "n/a" if not math.isfinite(never) else f"{never / 1e9:,.1f} GB"
    dwpd = m.drive_writes_per_day
    return (f"ssd wear                 written {m.ssd_write_bytes / 1e9:,.1f} GB, read back "
            f"{m.ssd_read_bytes / 1e9:,.1f} GB, never read {unread}; "
            + ("n/a" if not math.isfinite(dwpd) else f"{dwpd:.2f}")
            + f" drive-writes/day on a {m.drive_bytes / 1e12:g} TB drive "
            f"({m.simulated_s / 3600:.1f} h at this rate)")


def format_metrics(m: RunMetrics) -> str:
    """Human-readable block for ``flatcake replay``."""
    def f(v: float, unit: str = "", digits: int = 3) -> str:
        return "n/a" if not math.isfinite(v) else f"{v:.{digits}f}{unit}"

    lines = [
        f"system {m.system}  rate {m.rate_req_s:g} req/s  preset {m.preset}  trace {m.trace}"
        f"  seed {m.seed}",
        f"  hit_rate_gpu             {f(100 * m.hit_rate_gpu, ' %', 2)}   "
        f"(max_hit_rate {f(100 * m.max_hit_rate, ' %', 2)}"
        + (f", turn-end windows {f(100 * m.max_hit_rate_turn_ends, ' %', 2)})"
           if m.max_hit_rate_turn_ends != m.max_hit_rate else ")"),
        f"  ttft mean / p50 / p99    {f(m.ttft_mean_s, ' s')} / {f(m.ttft_p50_s, ' s')} / "
        f"{f(m.ttft_p99_s, ' s')}",
        f"  load                     requested {m.rate_req_s:g} req/s, offered "
        f"{f(m.offered_req_s, '', 3)}, delivered {f(m.throughput_req_s, ' req/s')}  "
        f"[{m.load_status}]  {f(m.throughput_tokens_s, ' tok/s', 0)}",
        f"  busy (mean per worker)   GPU {f(100 * m.gpu_busy_frac, ' %', 1)}   SSD "
        f"{f(100 * m.ssd_busy_frac, ' %', 1)}   queue per worker mean "
        f"{f(m.queue_mean, '', 2)} / p99 {f(m.queue_p99, '', 0)}",
        f"  ssd read per worker      {f(m.ssd_read_gbps_per_worker, ' GB/s', 2)}   "
        f"read amplification {f(m.read_amplification, '', 2)}   "
        f"commands {m.read_commands}",
        f"  prefetch mean / p99      {f(m.prefetch_time_mean_s, ' s')} / "
        f"{f(m.prefetch_time_p99_s, ' s')}   restores {m.num_restores}   "
        f"cancelled {m.prefetch_cancellations}",
        f"  recomputed tokens        {m.recomputed_tokens}",
        f"  {format_wear(m)}",
    ]
    if m.placements:
        lines.append("  placements by rule       " + ", ".join(
            f"{k} {v}" for k, v in m.placements.items() if v))
    lines.append(f"  {m.num_requests} requests, {m.simulated_s:.0f} s simulated, "
                 f"{m.wall_s:.1f} s wall ({m.cpu_s:.1f} s CPU)")
    return "\n".join(lines)
