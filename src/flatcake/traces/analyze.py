"""Reuse statistics of a trace: what ``flatcake analyze`` prints.

Definitions (the same as ``shared/traces/README.md``, which ``stats.json`` follows):

- block access: one id in one request's block list;
- ``share_blocks_used_once``: unique blocks accessed exactly once, over unique blocks;
- ``max_prefix_hit_rate``: for each request, the longest prefix of its blocks that all
  appeared in earlier requests, summed and divided by all block accesses: the hit rate
  of an infinite cache. ``max_prefix_hit_rate_tokens`` weights each request by
  ``min(k * block_size, input_tokens)`` over its ``input_tokens``;
- reuse distance: the difference in request index between consecutive accesses of a
  block, in the trace's order. On a session-clock trace there is no global order, so it
  is the within-session order and pairs of accesses from different sessions are left
  out; multiply by the number of interleaved sessions to estimate a replay's distance;
- reuse gap: the same pairs in seconds, floored (``floor(t2 - t1)``);
- session context: the largest ``input_tokens`` of a session (sub-agents included);
  its KV for a model geometry is ``session_kv_bytes``;
- major reset: a main-agent request sharing less than half of the previous main-agent
  request's blocks as a common prefix (compaction, ``/clear``);
- context growth: blocks a request adds beyond its common prefix with the previous
  request of the same agent, over requests that are not first turns or resets.

Percentiles are numpy's default (linear interpolation). Everything is vectorised:
the whole Claude Code trace (71.4 M accesses) is analysed with a few sorts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from flatcake.geometry import KVGeometry
from flatcake.traces.model import Trace

RESET_SHARED_FRACTION = 0.5
"""A main-agent request sharing less than this of its predecessor's blocks is a reset."""

CDF_POINTS = 201


@dataclass(frozen=True, slots=True)
class TraceStats:
    """The figures of one trace; ``None`` where the trace cannot give them.

    The first block of fields is the set ``flatcake analyze --json`` always emits
    (names as in the issue); the rest are supporting figures.
    """

    requests: int
    block_accesses: int | None
    unique_blocks: int | None
    share_blocks_used_once: float | None
    max_prefix_hit_rate: float | None
    reuse_distance_requests_median: float | None
    reuse_distance_requests_p90: float | None
    reuse_gap_seconds_median: float | None
    reuse_gap_seconds_p90: float | None
    input_tokens_mean: float
    input_tokens_p99: float
    sessions: int | None
    turns_per_session_mean: float | None
    session_context_tokens_mean: float | None
    session_context_tokens_p99: float | None
    session_kv_bytes_mean: float | None
    session_kv_bytes_p99: float | None
    # Supporting figures.
    trace: str
    source_format: str
    clock: str
    block_size_tokens: int
    has_hashes: bool
    model: str
    kv_bytes_per_token: int
    max_prefix_hit_rate_tokens: float | None
    share_requests_with_prefix_hit: float | None
    new_blocks_per_request_mean: float | None
    blocks_shared_across_sessions: int | None
    input_tokens_median: float
    output_tokens_mean: float
    output_tokens_median: float
    time_span_s: float | None
    think_time_seconds_median: float | None
    subagents: int | None
    turns_per_session_median: float | None
    session_context_tokens_median: float | None
    session_duration_seconds_median: float | None
    inter_request_gap_seconds_median: float | None
    inter_request_gap_seconds_p90: float | None
    share_sessions_with_reset: float | None
    context_growth_blocks_per_turn_mean: float | None
    skipped_lines: int

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True, slots=True)
class TraceAnalysis:
    """``TraceStats`` plus the distributions a plot needs.

    ``reuse_distance_cdf``: ``(CDF_POINTS,)`` reuse distances at quantiles
    ``linspace(0, 1, CDF_POINTS)`` (empty without hashes); ``session_context_tokens``:
    per session (empty without sessions); ``input_tokens`` / ``output_tokens``: per
    request.
    """

    stats: TraceStats
    reuse_distance_cdf: np.ndarray
    session_context_tokens: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray


def _pct(a: np.ndarray, q: float) -> float | None:
    return float(np.percentile(a, q)) if len(a) else None


def _mean(a: np.ndarray) -> float | None:
    return float(a.mean()) if len(a) else None


@dataclass(frozen=True, slots=True)
class _HashFigures:
    block_accesses: int
    unique_blocks: int
    share_once: float | None
    hit_blocks: float | None
    hit_tokens: float | None
    share_requests_hit: float | None
    dist_median: float | None
    dist_p90: float | None
    gap_median: float | None
    gap_p90: float | None
    dist_cdf: np.ndarray
    shared_across_sessions: int | None


def _hash_figures(trace: Trace) -> _HashFigures:
    """Block-level figures; a stable sort of the ids groups each block's accesses in order."""
    h = trace.block_hashes
    n = len(h)
    nreq = trace.num_requests
    counts = trace.num_blocks
    if n == 0:
        return _HashFigures(0, 0, None, None, None, None, None, None, None, None,
                            np.zeros(0), 0 if trace.num_sessions else None)
    req_dtype = np.int32 if nreq < 2**31 else np.int64
    req = np.repeat(np.arange(nreq, dtype=req_dtype), counts)
    order = np.argsort(h, kind="stable")  # by (id, position): accesses of a block in order
    hs = h[order]
    new_run = np.empty(n, dtype=bool)
    new_run[0] = True
    np.not_equal(hs[1:], hs[:-1], out=new_run[1:])
    del hs
    run_starts = np.flatnonzero(new_run)
    unique = len(run_starts)
    run_len = np.diff(np.append(run_starts, n))
    share_once = float((run_len == 1).sum()) / unique

    # An access is unseen when its block's first access is in the same request: the
    # first access itself, or a repeat inside that request. Sorted unseen positions
    # give each request's first unseen block, the end of its hit prefix.
    req_sorted = req[order]
    first_req = np.repeat(req_sorted[run_starts], run_len)
    del run_len
    unseen = np.sort(order[req_sorted == first_req])
    del first_req
    offsets = trace.block_offsets
    prefix = counts.copy()
    if len(unseen):
        r_unseen = req[unseen]
        first = np.r_[True, r_unseen[1:] != r_unseen[:-1]]
        r_first = r_unseen[first]
        prefix[r_first] = unseen[first] - offsets[r_first]
    del unseen
    hit_blocks = float(prefix.sum()) / n
    in_tok = trace.input_tokens
    tok_total = float(in_tok.sum())
    hit_tok = (float(np.minimum(prefix * trace.block_size_tokens, in_tok).sum()) / tok_total
               if tok_total else None)
    with_blocks = counts > 0
    share_req_hit = float((prefix[with_blocks] > 0).mean()) if with_blocks.any() else None

    shared_across: int | None = None
    if trace.num_sessions:
        shared_across = _blocks_in_several_sessions(trace, req_sorted, new_run, run_starts)
    del order, req
    # Consecutive accesses of one block: sorted neighbours inside a run.
    later = np.flatnonzero(~new_run)
    del new_run
    r2 = req_sorted[later]
    r1 = req_sorted[later - 1]
    del later, req_sorted
    if trace.num_sessions and trace.clock == "session":
        keep = trace.session[r1] == trace.session[r2]
        r1, r2 = r1[keep], r2[keep]
    dist = np.subtract(r2, r1, dtype=np.int64)
    gap = np.floor(trace.time_s[r2] - trace.time_s[r1]).astype(np.int64)
    del r1, r2
    qs = np.linspace(0, 100, CDF_POINTS)
    dist_q = _percentiles(dist, np.r_[50.0, 90.0, qs])
    gap_q = _percentiles(gap, np.array([50.0, 90.0]))
    return _HashFigures(
        block_accesses=n, unique_blocks=unique, share_once=share_once,
        hit_blocks=hit_blocks, hit_tokens=hit_tok, share_requests_hit=share_req_hit,
        dist_median=float(dist_q[0]) if len(dist) else None,
        dist_p90=float(dist_q[1]) if len(dist) else None,
        gap_median=float(gap_q[0]) if len(gap) else None,
        gap_p90=float(gap_q[1]) if len(gap) else None,
        dist_cdf=dist_q[2:], shared_across_sessions=shared_across)


def _percentiles(a: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """numpy's linear percentiles; for small non-negative ints, from a histogram (faster)."""
    if not len(a):
        return np.zeros(0)
    if a.dtype.kind not in "iu" or a.min() < 0 or a.max() > 50_000_000:
        return np.asarray(np.percentile(a, qs), dtype=np.float64)
    cum = np.cumsum(np.bincount(a.astype(np.int64)))
    rank = qs / 100.0 * (len(a) - 1)  # fractional index into the sorted array
    below, above = np.floor(rank).astype(np.int64), np.ceil(rank).astype(np.int64)
    v_below = np.searchsorted(cum, below, side="right").astype(np.float64)
    v_above = np.searchsorted(cum, above, side="right").astype(np.float64)
    return v_below + (rank - below) * (v_above - v_below)


def _blocks_in_several_sessions(trace: Trace, req_sorted: np.ndarray, new_run: np.ndarray,
                                run_starts: np.ndarray) -> int:
    """Unique blocks accessed by at least two sessions (accesses sorted by block)."""
    sess_sorted = trace.session[req_sorted]
    if trace.clock == "session":
        # Sessions are contiguous in request order, so inside a run they never decrease:
        # a change of session inside a run marks a block seen by one more session.
        change = np.flatnonzero(sess_sorted[1:] != sess_sorted[:-1]) + 1
        change = change[~new_run[change]]
        return len(np.unique(np.searchsorted(run_starts, change, side="right")))
    run_id = np.cumsum(new_run, dtype=np.int64) - 1
    known = sess_sorted >= 0
    pairs = np.unique(run_id[known] * trace.num_sessions + sess_sorted[known])
    per_block = np.bincount(pairs // trace.num_sessions)
    return int((per_block >= 2).sum())


@dataclass(frozen=True, slots=True)
class _SessionFigures:
    contexts: np.ndarray
    sizes: np.ndarray
    durations: np.ndarray
    gaps: np.ndarray
    share_reset: float | None
    growth_mean: float | None


def _session_figures(trace: Trace) -> _SessionFigures:
    order = trace._session_order
    offs = trace._session_offsets
    sizes = np.diff(offs)
    nonempty = sizes > 0
    starts = offs[:-1][nonempty]
    contexts = np.zeros(trace.num_sessions, dtype=np.int64)
    durations = np.zeros(trace.num_sessions)
    if len(order):
        contexts[nonempty] = np.maximum.reduceat(trace.input_tokens[order], starts)
        t = trace.time_s[order]
        durations[nonempty] = np.maximum.reduceat(t, starts) - np.minimum.reduceat(t, starts)
    # Gaps between consecutive requests of a session, in its time order.
    same = trace.session[order][1:] == trace.session[order][:-1]
    t_ord = trace.time_s[order]
    gaps = (t_ord[1:] - t_ord[:-1])[same]
    share_reset, growth = (_resets_and_growth(trace) if trace.has_hashes
                           else (None, None))
    return _SessionFigures(contexts, sizes, durations, gaps, share_reset, growth)


def _resets_and_growth(trace: Trace) -> tuple[float | None, float | None]:
    """Major resets per session and context growth per turn (see module docstring).

    With chained ids the positions where a request matches its predecessor form a
    prefix, so the common prefix length is found by a vectorised binary search.
    """
    sel = np.flatnonzero(trace.session >= 0)
    if not len(sel):
        return None, None
    key = trace.session[sel].astype(np.int64) * (int(trace.agent.max()) + 1) + trace.agent[sel]
    o = sel[np.argsort(key, kind="stable")]  # requests grouped by (session, agent), in order
    k_sorted = np.sort(key, kind="stable")
    pair = np.flatnonzero(k_sorted[1:] == k_sorted[:-1])
    prev, cur = o[pair], o[pair + 1]
    if not len(prev):
        return 0.0, None
    off = trace.block_offsets
    n_prev = off[prev + 1] - off[prev]
    n_cur = off[cur + 1] - off[cur]
    limit = np.minimum(n_prev, n_cur)
    lo = np.zeros(len(prev), dtype=np.int64)  # matches known for [0, lo)
    hi = limit.copy()
    h = trace.block_hashes
    while True:
        active = lo < hi
        if not active.any():
            break
        mid = (lo + hi + 1) // 2  # test position mid - 1
        idx = np.flatnonzero(active)
        m = mid[idx]
        eq = h[off[prev[idx]] + m - 1] == h[off[cur[idx]] + m - 1]
        lo[idx[eq]] = m[eq]
        hi[idx[~eq]] = m[~eq] - 1
    common = lo
    reset = (common < RESET_SHARED_FRACTION * n_prev) & (n_prev > 0)
    main = trace.agent[cur] == 0
    reset_sessions = np.unique(trace.session[cur[reset & main]])
    share_reset = len(reset_sessions) / trace.num_sessions
    growth = (n_cur - common)[~reset]
    return share_reset, (float(growth.mean()) if len(growth) else None)


def analyze_trace(trace: Trace, geometry: KVGeometry) -> TraceAnalysis:
    """Compute :class:`TraceStats` (and plot distributions) of ``trace``."""
    hf = _hash_figures(trace) if trace.has_hashes else None
    sf = _session_figures(trace) if trace.num_sessions else None
    in_tok = trace.input_tokens.astype(np.float64)
    out_tok = trace.output_tokens.astype(np.float64)
    think = trace.think_time_s[~np.isnan(trace.think_time_s)]
    bpt = geometry.bytes_per_token
    ctx = sf.contexts.astype(np.float64) if sf else np.zeros(0)
    stats = TraceStats(
        requests=trace.num_requests,
        block_accesses=hf.block_accesses if hf else None,
        unique_blocks=hf.unique_blocks if hf else None,
        share_blocks_used_once=hf.share_once if hf else None,
        max_prefix_hit_rate=hf.hit_blocks if hf else None,
        reuse_distance_requests_median=hf.dist_median if hf else None,
        reuse_distance_requests_p90=hf.dist_p90 if hf else None,
        reuse_gap_seconds_median=hf.gap_median if hf else None,
        reuse_gap_seconds_p90=hf.gap_p90 if hf else None,
        input_tokens_mean=_mean(in_tok) or 0.0,
        input_tokens_p99=_pct(in_tok, 99) or 0.0,
        sessions=trace.num_sessions if sf else None,
        turns_per_session_mean=_mean(sf.sizes.astype(np.float64)) if sf else None,
        session_context_tokens_mean=_mean(ctx) if sf else None,
        session_context_tokens_p99=_pct(ctx, 99) if sf else None,
        session_kv_bytes_mean=(_mean(ctx) or 0.0) * bpt if sf else None,
        session_kv_bytes_p99=(_pct(ctx, 99) or 0.0) * bpt if sf else None,
        trace=trace.name,
        source_format=trace.source_format,
        clock=trace.clock,
        block_size_tokens=trace.block_size_tokens,
        has_hashes=trace.has_hashes,
        model=geometry.name,
        kv_bytes_per_token=bpt,
        max_prefix_hit_rate_tokens=hf.hit_tokens if hf else None,
        share_requests_with_prefix_hit=hf.share_requests_hit if hf else None,
        new_blocks_per_request_mean=(hf.unique_blocks / trace.num_requests
                                     if hf and trace.num_requests else None),
        blocks_shared_across_sessions=hf.shared_across_sessions if hf else None,
        input_tokens_median=_pct(in_tok, 50) or 0.0,
        output_tokens_mean=_mean(out_tok) or 0.0,
        output_tokens_median=_pct(out_tok, 50) or 0.0,
        time_span_s=trace.time_span_s() if trace.clock == "global" else None,
        think_time_seconds_median=_pct(think, 50),
        subagents=len(trace.subagents) if sf else None,
        turns_per_session_median=_pct(sf.sizes.astype(np.float64), 50) if sf else None,
        session_context_tokens_median=_pct(ctx, 50) if sf else None,
        session_duration_seconds_median=_pct(sf.durations, 50) if sf else None,
        inter_request_gap_seconds_median=_pct(sf.gaps, 50) if sf else None,
        inter_request_gap_seconds_p90=_pct(sf.gaps, 90) if sf else None,
        share_sessions_with_reset=sf.share_reset if sf else None,
        context_growth_blocks_per_turn_mean=sf.growth_mean if sf else None,
        skipped_lines=trace.num_skipped_lines,
    )
    return TraceAnalysis(
        stats=stats,
        reuse_distance_cdf=hf.dist_cdf if hf else np.zeros(0),
        session_context_tokens=sf.contexts if sf else np.zeros(0, dtype=np.int64),
        input_tokens=trace.input_tokens,
        output_tokens=trace.output_tokens,
    )

