"""Cross-check ``analyze`` against ``shared/traces/stats.json`` (computed independently).

Rates must agree within 0.5 percentage points, means within 1%; medians and
percentiles of integer quantities are expected to agree exactly. Skipped when the
shared traces are absent. The Claude Code file is read and analysed once per module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flatcake.geometry import preset
from flatcake.traces import TraceStats, analyze_trace, read_trace

pytestmark = pytest.mark.traces

GEOM = preset("llama-3.1-8b")
MOONCAKE = "mooncake-fast25/conversation_trace.jsonl"
CLAUDE_CODE = "weka-claude-code/weka_claude_code_traces.jsonl.gz"
AZURE = ("azure-llm-2023/AzureLLMInferenceTrace_code.csv",
         "azure-llm-2023/AzureLLMInferenceTrace_conv.csv")

RATE_POINTS = 0.005
MEAN_REL = 0.01


def _expected(root: Path, name: str) -> dict[str, Any]:
    return json.loads((root / "stats.json").read_text())[name]  # type: ignore[no-any-return]


def _analyze(root: Path, name: str) -> TraceStats:
    return analyze_trace(read_trace(root / name), GEOM).stats


def _check_common(st: TraceStats, exp: dict[str, Any]) -> None:
    assert st.requests == exp["requests"]
    assert st.input_tokens_mean == pytest.approx(exp["input_len_mean"], rel=MEAN_REL)
    assert st.input_tokens_median == pytest.approx(exp["input_len_median"], rel=MEAN_REL)
    assert st.input_tokens_p99 == pytest.approx(exp["input_len_p99"], rel=MEAN_REL)
    assert st.output_tokens_mean == pytest.approx(exp["output_len_mean"], rel=MEAN_REL)


def _check_hashes(st: TraceStats, exp: dict[str, Any]) -> None:
    assert st.block_size_tokens == exp["block_size_tokens"]
    assert st.block_accesses == exp["block_accesses"]
    assert st.unique_blocks == exp["unique_blocks"]
    assert st.share_blocks_used_once == pytest.approx(
        exp["share_unique_blocks_accessed_once"], abs=RATE_POINTS)
    assert st.max_prefix_hit_rate == pytest.approx(
        exp["infinite_cache_prefix_hit_share_blocks"], abs=RATE_POINTS)
    assert st.max_prefix_hit_rate_tokens == pytest.approx(
        exp["infinite_cache_prefix_hit_share_tokens"], abs=RATE_POINTS)
    assert st.share_requests_with_prefix_hit == pytest.approx(
        exp["share_requests_with_prefix_hit"], abs=RATE_POINTS)
    for ours, theirs in (("reuse_distance_requests_median", "reuse_distance_requests_median"),
                         ("reuse_distance_requests_p90", "reuse_distance_requests_p90"),
                         ("reuse_gap_seconds_median", "reuse_gap_seconds_median"),
                         ("reuse_gap_seconds_p90", "reuse_gap_seconds_p90")):
        assert getattr(st, ours) == exp[theirs], ours


def test_mooncake_matches_stats_json(shared_traces: Path) -> None:
    exp = _expected(shared_traces, MOONCAKE)
    st = _analyze(shared_traces, MOONCAKE)
    _check_common(st, exp)
    _check_hashes(st, exp)
    assert st.time_span_s == pytest.approx(exp["time_span_s"], rel=MEAN_REL)
    assert st.sessions is None


@pytest.fixture(scope="module")
def claude_code(shared_traces: Path) -> tuple[TraceStats, dict[str, Any]]:
    return _analyze(shared_traces, CLAUDE_CODE), _expected(shared_traces, CLAUDE_CODE)


def test_claude_code_matches_stats_json(claude_code: tuple[TraceStats, dict[str, Any]]) -> None:
    st, exp = claude_code
    _check_common(st, exp)
    _check_hashes(st, exp)


def test_claude_code_sessions_match_stats_json(
        claude_code: tuple[TraceStats, dict[str, Any]]) -> None:
    st, exp = claude_code
    ses = exp["sessions"]
    assert st.sessions == ses["sessions"]
    assert st.subagents == ses["subagents"]
    assert st.turns_per_session_mean == pytest.approx(ses["turns_per_session_mean"],
                                                      rel=MEAN_REL)
    assert st.turns_per_session_median == ses["turns_per_session_median"]
    assert st.session_context_tokens_mean == pytest.approx(ses["session_context_tokens_mean"],
                                                           rel=MEAN_REL)
    assert st.session_context_tokens_median == pytest.approx(
        ses["session_context_tokens_median"], rel=MEAN_REL)
    assert st.session_context_tokens_p99 == pytest.approx(ses["session_context_tokens_p99"],
                                                          rel=MEAN_REL)
    assert st.session_duration_seconds_median == ses["session_duration_s_median"]
    assert st.inter_request_gap_seconds_median == ses["inter_request_gap_s_median"]
    assert st.inter_request_gap_seconds_p90 == ses["inter_request_gap_s_p90"]
    assert st.session_kv_bytes_mean == pytest.approx(
        ses["session_context_tokens_mean"] * GEOM.bytes_per_token, rel=MEAN_REL)
    # README: about 70 new blocks per request; ids are per session, so nothing is shared.
    assert st.new_blocks_per_request_mean == pytest.approx(
        exp["unique_blocks"] / exp["requests"], rel=MEAN_REL)
    assert st.blocks_shared_across_sessions == 0


@pytest.mark.parametrize("name", AZURE)
def test_azure_matches_stats_json(shared_traces: Path, name: str) -> None:
    exp = _expected(shared_traces, name)
    trace = read_trace(shared_traces / name)
    st = analyze_trace(trace, GEOM).stats
    _check_common(st, exp)
    assert st.time_span_s == pytest.approx(exp["time_span_s"], rel=MEAN_REL)
    assert trace.start_unix_s == pytest.approx(exp["first_timestamp_utc"], abs=1e-3)
    assert not st.has_hashes and st.max_prefix_hit_rate is None
