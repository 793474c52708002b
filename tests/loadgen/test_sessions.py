"""A trace's sessions as load-generator sessions: turns in order, ids kept, contexts
fitted to the server's budget by scaling tokens per block, then cutting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flatcake.loadgen import TokenSpace, trace_workload
from flatcake.traces.model import SubAgent, Trace, build_trace

SPACE = TokenSpace(vocab_size=1 << 30)


def two_sessions(block: int = 64) -> Trace:
    """Session 0: three turns growing 2 -> 3 -> 5 blocks (the middle one a sub-agent);
    session 1: one turn of 4 blocks, 10 tokens past its last block."""
    hashes = [[1, 2], [1, 2, 3], [1, 2, 3, 4, 5], [10, 11, 12, 13]]
    return build_trace(
        name="toy", source_format="native", block_size_tokens=block, clock="session",
        has_hashes=True, partial_last_block=False, time_s=[0, 1, 2, 0],
        input_tokens=[2 * block, 3 * block, 5 * block, 4 * block + 10],
        output_tokens=[5] * 4, block_counts=[len(h) for h in hashes],
        block_hashes=np.array([i for h in hashes for i in h], dtype=np.int64),
        session=[0, 0, 0, 1], agent=[0, 1, 0, 0], session_names=["alice", "bob"],
        subagents=[SubAgent(session=0, agent=1, parent_agent=0, spawn_time_s=0.5)])


def test_sessions_keep_their_turns_in_order_and_their_ids() -> None:
    wl = trace_workload(two_sessions(), budget_tokens=4096, max_tokens=8, tokens=SPACE)
    alice, bob = list(wl.sessions)
    assert wl.block_tokens == 64 and wl.num_requests == 4 and wl.num_cut == 0
    assert [t.block_ids.tolist() for t in alice.turns] == [[1, 2], [1, 2, 3],
                                                           [1, 2, 3, 4, 5]]
    assert [alice.session_id(k) for k in range(3)] == ["alice", "alice/agent-1", "alice"]
    assert bob.session_id(0) == "bob" and bob.turns[0].tail_tokens == 10
    assert all(t.max_tokens == 8 for t in alice.turns)
    # Turn 1 repeats turn 0's two blocks token for token, then differs.
    p0, p1 = wl.prompt(alice.turns[0]), wl.prompt(alice.turns[1])
    assert p1[:128] == p0[:128] and len(p1) == 3 * 64 == wl.prompt_tokens(alice.turns[1])


def test_long_contexts_are_scaled_to_the_budget() -> None:
    # The 90th-percentile request (~304 tokens) is scaled to 160: 33 tokens per block;
    # the longest (5 blocks, 165 tokens) is cut to 4.
    wl = trace_workload(two_sessions(), budget_tokens=160, max_tokens=8, tokens=SPACE)
    assert wl.block_tokens < 64
    turns = [t for s in wl.sessions for t in s.turns]
    assert all(wl.prompt_tokens(t) <= 160 for t in turns)
    assert "scaled from 64" in wl.description
    # The ids stay the trace's: reuse is still exactly the shared ids.
    assert turns[2].block_ids.tolist()[:3] == turns[1].block_ids.tolist()


def test_an_explicit_block_size_cuts_what_does_not_fit() -> None:
    wl = trace_workload(two_sessions(), budget_tokens=200, max_tokens=8, tokens=SPACE,
                        block_tokens=64)
    turns = [t for s in wl.sessions for t in s.turns]
    assert [len(t.block_ids) for t in turns] == [2, 3, 3, 3]
    assert wl.num_cut == 2 and all(wl.prompt_tokens(t) <= 200 for t in turns)
    with pytest.raises(ValueError, match="exceeds the context budget"):
        trace_workload(two_sessions(), budget_tokens=32, max_tokens=8, tokens=SPACE,
                       block_tokens=64)


def test_first_sessions_only_and_a_trace_without_sessions() -> None:
    wl = trace_workload(two_sessions(), budget_tokens=4096, max_tokens=8, tokens=SPACE,
                        sessions=1)
    assert [s.name for s in wl.sessions] == ["alice"]
    flat = build_trace(name="mc", source_format="mooncake", block_size_tokens=512,
                       clock="global", has_hashes=True, partial_last_block=True,
                       time_s=[0, 1, 2], input_tokens=[600, 1000, 100],
                       output_tokens=[1, 1, 1], block_counts=[2, 2, 1],
                       block_hashes=np.array([0, 1, 0, 2, 3]))
    wl = trace_workload(flat, budget_tokens=4096, max_tokens=8, tokens=SPACE)
    sessions = list(wl.sessions)
    assert [s.name for s in sessions] == ["request-0", "request-1", "request-2"]
    assert all(len(s.turns) == 1 for s in sessions)


def test_a_trace_without_hashes_is_refused() -> None:
    lengths = build_trace(name="azure", source_format="azure", block_size_tokens=1,
                          clock="global", has_hashes=False, partial_last_block=False,
                          time_s=[0.0], input_tokens=[10], output_tokens=[1],
                          block_counts=[0], block_hashes=np.zeros(0, dtype=np.int64))
    with pytest.raises(ValueError, match="no block hashes"):
        trace_workload(lengths, budget_tokens=100, max_tokens=1, tokens=SPACE)


@pytest.mark.traces
def test_the_mooncake_trace_keeps_its_shared_first_block(shared_traces: Path) -> None:
    from flatcake.traces import read_trace

    trace = read_trace(shared_traces / "mooncake-fast25" / "conversation_trace.jsonl")
    wl = trace_workload(trace, budget_tokens=2048, max_tokens=16, tokens=SPACE,
                        sessions=50)
    turns = [s.turns[0] for s in wl.sessions]
    assert len(turns) == 50 and all(wl.prompt_tokens(t) <= 2048 for t in turns)
    # README: 99.99% of requests share the first 512-token block (id 0).
    firsts = [wl.prompt(t)[:wl.block_tokens] for t in turns[:10]]
    assert all(f == firsts[0] for f in firsts)
