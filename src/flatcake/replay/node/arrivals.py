"""The replay's arrival model: when each session starts so that the requested request
rate is really offered.

A session trace (Claude Code) has no global clock: each session starts at 0 and its
chains (the main agent, sub-agents) issue their requests one after the other, each
``think_s`` after the previous reply. The replay keeps that per-session order and those
think times and chooses when sessions start:

* **Open-loop Poisson session starts.** Sessions start as a Poisson process in a random
  order (seeded), the way new users arrive; the load knob is the request rate.
* **Think times capped** at ``think_cap_s`` (a preset value). The trace's long gaps are a
  user away from the keyboard (the 99th percentile is minutes, the largest hours); an
  uncapped gap would stretch a session past the end of every other session, and the
  requested rate could never be delivered by a finite trace.
* **Session-start rate sized so the rate is delivered.** A finite trace ramps up and
  drains; with sessions that last long against the span of their starts, the naive
  session rate ``rate x sessions / requests`` offers far less than ``rate`` in the
  measured window. The session-start rate is therefore solved for (bisection) so that
  the *ideal schedule* -- every request sent at its session start plus the capped think
  times plus an unloaded service-time estimate -- offers ``rate`` requests/s between the
  10th and 90th percentile of its arrival times, the same window in which the delivered
  rate is measured. When the node keeps up, delivered equals requested; when it falls
  behind, the closed loop inside each chain sends later and the delivered rate drops:
  that is saturation, reported as such.

This is how the paper raised load as far as it says: a fixed trace replayed at a higher
request rate means more sessions live at once (more KV in flight), with each session's
own pacing kept. Global-clock traces (Mooncake) keep their recorded timestamps scaled to
the requested rate; that already offers exactly ``rate``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from flatcake.replay.node.devices import GpuSpec
from flatcake.replay.workload.trace import Workload
from flatcake.replay.workload.types import FloatArray

WINDOW_PCT = (10.0, 90.0)
"""Percentiles of arrival times bounding the measured window (offered and delivered)."""


@dataclass(frozen=True, slots=True)
class Schedule:
    """When each session and each chain starts.

    Attributes:
        session_start_s: per session, its start time.
        chain_start_s: per chain, its first request's arrival time.
        think_s: per request, the (capped) delay after its chain's previous reply.
        offered_req_s: request rate of the ideal schedule in its measured window.
        unreachable: True when no session-start rate offers the requested rate (the
            trace's sessions are too long for it even all starting at once).
    """

    session_start_s: FloatArray
    chain_start_s: FloatArray
    think_s: FloatArray
    offered_req_s: float
    unreachable: bool


def window_rate(times: FloatArray) -> float:
    """Requests per second between the window percentiles of ``times``."""
    if len(times) < 10:
        span = float(times.max() - times.min()) if len(times) > 1 else 0.0
        return (len(times) - 1) / span if span > 0 else math.inf
    lo, hi = np.percentile(times, WINDOW_PCT)
    span = float(hi - lo)
    inside = int(np.count_nonzero((times >= lo) & (times <= hi)))
    return inside / span if span > 0 else math.inf


def service_estimate_s(wl: Workload, gpu: GpuSpec, bytes_per_token: int) -> FloatArray:
    """Unloaded time from a request's arrival to its last token: the prefill of what its
    chain's previous request did not hold plus its decode steps alone on the GPU."""
    inp = wl.input_tokens.astype(np.float64)
    prev = np.zeros_like(inp)
    order = wl.chain_req
    if len(order):
        same = np.zeros(len(order), dtype=bool)
        chains = wl.chain[order]
        same[1:] = chains[1:] == chains[:-1]
        shifted = np.zeros(len(order))
        shifted[1:] = inp[order[:-1]]
        prev[order] = np.where(same, shifted, 0.0)
    new = np.maximum(inp - prev, 0.0)
    cached = inp - new
    prefill = (gpu.prefill_overhead_s + new / gpu.prefill_tokens_per_s
               + gpu.attn_s_per_token_pair * new * (cached + new / 2))
    step = (gpu.decode_step_base_s + gpu.decode_step_per_seq_s
            + inp * bytes_per_token / gpu.hbm_bytes_per_s)
    return np.asarray(prefill + np.maximum(wl.output_tokens - 1, 0) * step)


def _offsets(wl: Workload, think: FloatArray, service: FloatArray) -> FloatArray:
    """Per request, its ideal arrival time relative to its session's start."""
    order = wl.chain_req
    gaps = think[order].copy()
    # The previous request's service comes before this one's think time.
    svc = np.zeros(len(order))
    svc[1:] = service[order[:-1]]
    first = np.zeros(len(order), dtype=bool)
    first[wl.chain_ptr[:-1]] = True
    gaps += np.where(first, 0.0, svc)
    gaps[first] = 0.0
    csum = np.cumsum(gaps)
    base = np.repeat(csum[wl.chain_ptr[:-1]], np.diff(wl.chain_ptr))
    chain_of = np.repeat(np.arange(wl.num_chains), np.diff(wl.chain_ptr))
    out = np.empty(len(order))
    out[order] = csum - base + wl.chain_offset_s[chain_of]
    return out


def session_schedule(wl: Workload, rate_req_s: float, think_cap_s: float, gpu: GpuSpec,
                     bytes_per_token: int, seed: int) -> Schedule:
    """The schedule of a session workload at ``rate_req_s`` (see the module docstring)."""
    if not rate_req_s > 0:
        raise ValueError(f"rate_req_s must be > 0, got {rate_req_s!r}")
    if not think_cap_s > 0:
        raise ValueError(f"think_cap_s must be > 0, got {think_cap_s!r}")
    rng = np.random.default_rng(seed)
    ns = wl.num_sessions
    order = rng.permutation(ns)
    gaps = rng.exponential(1.0, ns)
    gaps[0] = 0.0
    unit = np.empty(ns)
    unit[order] = np.cumsum(gaps)  # session starts of a unit-rate Poisson process
    think = np.minimum(wl.think_s, think_cap_s)
    offs = _offsets(wl, think, service_estimate_s(wl, gpu, bytes_per_token))
    sess = wl.session.astype(np.int64)

    def offered(lam: float) -> float:
        return window_rate(unit[sess] / lam + offs)

    # The naive session rate, then bisection on log(rate) for offered == rate_req_s.
    lam0 = rate_req_s * ns / max(wl.num_requests, 1)
    lo, hi = lam0 / 4, lam0
    while offered(hi) < rate_req_s and hi < lam0 * 1e6:
        lo, hi = hi, hi * 4
    unreachable = offered(hi) < rate_req_s * 0.999
    if not unreachable:
        while offered(lo) > rate_req_s and lo > lam0 * 1e-6:
            lo /= 4
        for _ in range(40):
            mid = math.sqrt(lo * hi)
            if offered(mid) < rate_req_s:
                lo = mid
            else:
                hi = mid
    lam = hi
    starts = unit / lam
    chain_start = starts[wl.chain_session] + wl.chain_offset_s
    return Schedule(session_start_s=starts, chain_start_s=chain_start, think_s=think,
                    offered_req_s=offered(lam), unreachable=bool(unreachable))
