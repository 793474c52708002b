"""The built-in workload: reproducible, and ``analyze`` recovers its parameters."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from flatcake.geometry import preset
from flatcake.traces import (
    AgentParams,
    ChatParams,
    LogNormal,
    TraceStats,
    WorkloadSpec,
    analyze_trace,
    generate_workload,
)

GEOM = preset("llama-3.1-8b")


def test_same_seed_same_trace_other_seed_differs() -> None:
    a = generate_workload(WorkloadSpec(kind="mixed", num_sessions=8, seed=11))
    b = generate_workload(WorkloadSpec(kind="mixed", num_sessions=8, seed=11))
    c = generate_workload(WorkloadSpec(kind="mixed", num_sessions=8, seed=12))
    for col in ("time_s", "session", "agent", "input_tokens", "output_tokens",
                "block_offsets", "block_hashes"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col
    assert a.session_names == b.session_names
    assert not np.array_equal(a.input_tokens[:20], c.input_tokens[:20])


def test_trace_invariants() -> None:
    tr = generate_workload(WorkloadSpec(kind="mixed", num_sessions=12, seed=1))
    assert tr.clock == "session" and tr.has_hashes and not tr.partial_last_block
    assert np.array_equal(tr.num_blocks, tr.input_tokens // tr.block_size_tokens)
    for s in range(tr.num_sessions):
        rs = tr.requests_of_session(s)
        assert np.all(np.diff(tr.time_s[rs]) >= 0)
        assert tr.time_s[rs[0]] == 0.0
    kinds = {name.split("-")[0] for name in tr.session_names}
    assert kinds == {"agent", "chat"}


@pytest.fixture(scope="module")
def agent_stats() -> tuple[AgentParams, TraceStats]:
    params = AgentParams(subagent_spawn_per_turn=0.0)
    spec = WorkloadSpec(kind="agent", num_sessions=120, seed=5, agent=params)
    return params, analyze_trace(generate_workload(spec), GEOM).stats


def test_agent_workload_reproduces_its_parameters(
        agent_stats: tuple[AgentParams, TraceStats]) -> None:
    p, st = agent_stats
    assert st.sessions == 120 and st.subagents == 0
    assert st.turns_per_session_mean == pytest.approx(p.turns.mean, rel=0.03)
    assert st.turns_per_session_median == pytest.approx(p.turns.median, rel=0.05)
    assert st.output_tokens_mean == pytest.approx(p.output_tokens.mean, rel=0.02)
    # A turn whose growth would pass the compaction limit compacts instead, so the
    # largest draws never count as growth: the measured mean sits a few % below.
    growth_blocks = p.growth_tokens.mean / 64
    assert st.context_growth_blocks_per_turn_mean == pytest.approx(growth_blocks, rel=0.07)
    # First turns think 0 s, which pulls the median a little below the parameter.
    assert st.think_time_seconds_median == pytest.approx(p.think_time_s.median, rel=0.06)
    # The tools + system prefix is shared by every session, block for block.
    assert st.blocks_shared_across_sessions == p.prefix_tokens // 64


def test_agent_workload_matches_the_claude_code_trace(
        agent_stats: tuple[AgentParams, TraceStats]) -> None:
    # Emergent figures against the shared trace's (README): hit 96.3%, reuse gap 20 / 128 s,
    # gaps between requests 17 / 128 s, 53.5% of sessions with a major reset.
    _, st = agent_stats
    assert st.max_prefix_hit_rate == pytest.approx(0.963, abs=0.015)
    assert st.reuse_distance_requests_median == 1
    assert st.reuse_gap_seconds_median == pytest.approx(20, abs=3)
    assert st.reuse_gap_seconds_p90 == pytest.approx(128, rel=0.15)
    assert st.inter_request_gap_seconds_median == pytest.approx(17.5, abs=2)
    assert st.share_sessions_with_reset == pytest.approx(0.535, abs=0.1)
    assert st.input_tokens_mean == pytest.approx(121_076, rel=0.2)


def test_chat_workload_reproduces_chat_statistics() -> None:
    p = ChatParams()
    spec = WorkloadSpec(kind="chat", num_sessions=1500, seed=2, chat=p)
    st = analyze_trace(generate_workload(spec), GEOM).stats
    assert st.turns_per_session_mean == pytest.approx(p.turns_mean, rel=0.03)
    assert st.output_tokens_mean == pytest.approx(p.output_tokens.mean, rel=0.03)
    assert st.blocks_shared_across_sessions == p.prefix_tokens // 64
    # Kimi chat figures (README): 75.8% used once, hit 36.6%, reuse gap median 113 s.
    assert st.share_blocks_used_once == pytest.approx(0.758, abs=0.03)
    assert st.max_prefix_hit_rate == pytest.approx(0.366, abs=0.05)
    assert st.reuse_gap_seconds_median == pytest.approx(113, rel=0.15)
    assert st.input_tokens_mean == pytest.approx(12_035, rel=0.1)


def test_mixed_and_unshared_prefix() -> None:
    agent = AgentParams(share_prefix=False)
    spec = WorkloadSpec(kind="mixed", num_sessions=10, chat_share=0.3, seed=4, agent=agent)
    tr = generate_workload(spec)
    assert sum(n.startswith("chat") for n in tr.session_names) == 3
    st = analyze_trace(tr, GEOM).stats
    # Only the chat system prompt is shared now.
    assert st.blocks_shared_across_sessions == ChatParams().prefix_tokens // 64


def test_lognormal_helpers() -> None:
    law = LogNormal.from_median_mean(47, 71.3)
    assert law.mean == pytest.approx(71.3)
    assert LogNormal.from_median_p90(10, 100).at(np.array([0.5, 0.9])) == pytest.approx(
        [10, 100])
    with pytest.raises(ValueError, match="median"):
        LogNormal(0, 1)
    with pytest.raises(ValueError, match="below"):
        LogNormal.from_median_mean(10, 5)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"num_sessions": 0}, "num_sessions"),
        ({"kind": "batch"}, "kind"),
        ({"chat_share": 1.5}, "chat_share"),
        ({"block_size_tokens": 0}, "block_size_tokens"),
    ],
)
def test_bad_spec_rejected(change: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(WorkloadSpec(), **change)  # type: ignore[arg-type]


def test_bad_params_rejected() -> None:
    with pytest.raises(ValueError, match="reset"):
        AgentParams(rerender_reset_per_turn=2.0)
    with pytest.raises(ValueError, match="compact_above_tokens"):
        AgentParams(compact_above_tokens=1000)
    with pytest.raises(ValueError, match="multi_turn_mean"):
        ChatParams(multi_turn_mean=1.0)
