"""Reuse statistics on tiny traces whose every figure is worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from flatcake.geometry import preset
from flatcake.traces import Trace, analyze_trace, build_trace
from tests.traces.helpers import global_trace

GEOM = preset("llama-3.1-8b")  # 128 KiB of KV per token


def test_global_trace_by_hand() -> None:
    st = analyze_trace(global_trace(), GEOM).stats
    assert (st.requests, st.block_accesses, st.unique_blocks) == (4, 11, 6)
    # Blocks 4, 5, 6 are read once; 1, 2 three times; 3 twice.
    assert st.share_blocks_used_once == pytest.approx(3 / 6)
    # Seen prefixes: r1 [1 2], r3 [1 2 3]; r0 and r2 none.
    assert st.max_prefix_hit_rate == pytest.approx(5 / 11)
    assert st.max_prefix_hit_rate_tokens == pytest.approx((8 + 12) / 43)
    assert st.share_requests_with_prefix_hit == pytest.approx(2 / 4)
    # Reuse pairs: block 1 and 2: r0->r1 (1 req, 1.5 s), r1->r3 (2 req, 8.5 s);
    # block 3: r0->r3 (3 req, 10 s). Distances [1 1 2 2 3], gaps floored [1 1 8 8 10].
    assert st.reuse_distance_requests_median == 2
    assert st.reuse_distance_requests_p90 == pytest.approx(2.6)
    assert st.reuse_gap_seconds_median == 8
    assert st.reuse_gap_seconds_p90 == pytest.approx(9.2)
    assert st.input_tokens_mean == pytest.approx(43 / 4)
    assert st.input_tokens_p99 == pytest.approx(np.percentile([12, 12, 3, 16], 99))
    assert st.time_span_s == 10.0
    assert st.new_blocks_per_request_mean == pytest.approx(6 / 4)
    assert st.sessions is None and st.session_kv_bytes_mean is None


def _session_trace() -> Trace:
    # Two sessions on their own clocks, 16-token blocks, block 100 shared by both:
    #   A: r0 t=0 [100 1 2]   r1 t=5 [100 1 2 3]   r2 t=12 [100 7 8 9]  (major reset)
    #   B: r3 t=0 [100 20]    r4 t=30 [100 20 21]
    lists = [[100, 1, 2], [100, 1, 2, 3], [100, 7, 8, 9], [100, 20], [100, 20, 21]]
    return build_trace(
        name="sessions", source_format="test", block_size_tokens=16, clock="session",
        has_hashes=True, partial_last_block=False, time_s=[0, 5, 12, 0, 30],
        input_tokens=[16 * len(x) + 5 for x in lists], output_tokens=[10] * 5,
        block_counts=[len(x) for x in lists],
        block_hashes=np.array([i for x in lists for i in x], dtype=np.int64),
        session=[0, 0, 0, 1, 1], session_names=["A", "B"],
        think_time_s=[0.0, 2.0, 4.0, 0.0, 20.0])


def test_session_trace_by_hand() -> None:
    st = analyze_trace(_session_trace(), GEOM).stats
    assert (st.block_accesses, st.unique_blocks) == (16, 9)
    assert st.share_blocks_used_once == pytest.approx(5 / 9)  # 3, 7, 8, 9, 21
    # Hits: r1 3, r2 1 (block 100), r3 1 (100, first seen in session A), r4 2.
    assert st.max_prefix_hit_rate == pytest.approx(7 / 16)
    # Pairs within sessions only (the A -> B pair of block 100 has no common clock):
    # distances all 1; gaps 5 5 5 7 30 30.
    assert st.reuse_distance_requests_median == 1
    assert st.reuse_distance_requests_p90 == 1
    assert st.reuse_gap_seconds_median == 6
    assert st.blocks_shared_across_sessions == 1
    assert st.sessions == 2 and st.turns_per_session_mean == 2.5
    # Session context = largest input: A 69, B 53 tokens.
    assert st.session_context_tokens_mean == 61
    assert st.session_kv_bytes_mean == 61 * 128 * 1024
    assert st.session_kv_bytes_p99 == pytest.approx(np.percentile([69, 53], 99) * 128 * 1024)
    assert st.share_sessions_with_reset == 0.5
    # Growth without resets: A r0->r1 adds 1 block, B r3->r4 adds 1.
    assert st.context_growth_blocks_per_turn_mean == 1.0
    assert st.inter_request_gap_seconds_median == 7  # gaps 5, 7, 30
    assert st.session_duration_seconds_median == 21  # 12 and 30
    assert st.think_time_seconds_median == 2.0
    assert st.time_span_s is None


def test_repeats_inside_a_request_are_not_hits() -> None:
    # r1 reads block 9 twice: the second read is not "seen in an earlier request".
    tr = build_trace(name="dup", source_format="test", block_size_tokens=1, clock="global",
                     has_hashes=True, partial_last_block=False, time_s=[0, 1],
                     input_tokens=[1, 3], output_tokens=[0, 0], block_counts=[1, 3],
                     block_hashes=np.array([5, 5, 9, 9]))
    st = analyze_trace(tr, GEOM).stats
    assert st.max_prefix_hit_rate == pytest.approx(1 / 4)
    assert st.share_blocks_used_once == 0.0
    assert st.reuse_distance_requests_median == pytest.approx(np.median([1, 0]))


def test_lengths_only_trace_has_no_prefix_figures() -> None:
    tr = build_trace(name="len", source_format="test", block_size_tokens=16, clock="global",
                     has_hashes=False, partial_last_block=False, time_s=[0, 2],
                     input_tokens=[100, 300], output_tokens=[5, 7], block_counts=[0, 0],
                     block_hashes=np.zeros(0, dtype=np.int64))
    an = analyze_trace(tr, GEOM)
    st = an.stats
    assert st.block_accesses is None and st.max_prefix_hit_rate is None
    assert st.reuse_gap_seconds_median is None and st.share_blocks_used_once is None
    assert st.input_tokens_mean == 200 and st.output_tokens_mean == 6
    assert len(an.reuse_distance_cdf) == 0


def test_reuse_distance_cdf_is_monotone_quantiles() -> None:
    an = analyze_trace(global_trace(), GEOM)
    cdf = an.reuse_distance_cdf
    assert cdf[0] == 1 and cdf[-1] == 3
    assert np.all(np.diff(cdf) >= 0)
    assert cdf[len(cdf) // 2] == an.stats.reuse_distance_requests_median
