"""Workload conversion: dense ids keep identity, runs rebuild every request, chains and
think times come from the trace, the cache round-trips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flatcake.replay.workload.trace import Workload, dense_runs, expand_runs, from_trace
from flatcake.traces.model import build_trace


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(-5, 40), max_size=12, unique=True), min_size=1,
                max_size=8))
def test_dense_runs_keep_block_identity(reqs: list[list[int]]) -> None:
    counts = [len(r) for r in reqs]
    offsets = np.zeros(len(reqs) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    flat = np.asarray([b for r in reqs for b in r], dtype=np.int64)
    run_ptr, run_start, run_len, num_ids = dense_runs(offsets, flat)
    assert num_ids == len(set(flat.tolist()))
    dense = [expand_runs(run_start[run_ptr[i]:run_ptr[i + 1]],
                         run_len[run_ptr[i]:run_ptr[i + 1]]).tolist()
             for i in range(len(reqs))]
    mapping: dict[int, int] = {}
    for orig, d in zip(reqs, dense, strict=True):
        assert len(orig) == len(d)
        for a, b in zip(orig, d, strict=True):
            assert mapping.setdefault(a, b) == b  # same id -> same dense id
    assert len(set(mapping.values())) == len(mapping)  # distinct -> distinct
    assert all(0 <= v < num_ids for v in mapping.values())


def test_from_trace_chains_think_times_and_cache(tmp_path: Path) -> None:
    # Session 0: main agent (3 requests) and a sub-agent (2); session 1: 1 request.
    tr = build_trace(
        name="t", source_format="test", block_size_tokens=64, clock="session",
        has_hashes=True, partial_last_block=False,
        time_s=[0.0, 10.0, 30.0, 12.0, 15.0, 0.0],
        input_tokens=[128, 192, 256, 64, 128, 64], output_tokens=[5, 6, 7, 8, 9, 10],
        block_counts=[2, 3, 4, 1, 2, 1],
        block_hashes=np.array([1, 2, 1, 2, 3, 1, 2, 3, 4, 9, 9, 10, (1 << 40) | 1],
                              dtype=np.int64),
        session=[0, 0, 0, 0, 0, 1], agent=[0, 0, 0, 1, 1, 0],
        think_time_s=[0.0, 4.0, float("nan"), 0.0, 1.5, 0.0],
        session_names=["a", "b"])
    wl = from_trace(tr)
    assert wl.num_chains == 3
    assert wl.requests_of_chain(0).tolist() == [0, 1, 2]
    assert wl.requests_of_chain(1).tolist() == [3, 4]
    assert wl.chain_offset_s.tolist() == [0.0, 12.0, 0.0]
    # Think time: the trace's value, else the recorded gap; 0 for a chain's first.
    assert wl.think_s.tolist() == [0.0, 4.0, 20.0, 0.0, 1.5, 0.0]
    assert wl.turn.tolist() == [0, 1, 2, 0, 1, 0]
    assert wl.blocks(2).tolist()[:2] == wl.blocks(0).tolist()
    assert wl.num_ids == 7
    wl.save(tmp_path / "w.npz")
    back = Workload.load(tmp_path / "w.npz")
    assert back.summary() == wl.summary()
    assert [back.runs(i) for i in range(6)] == [wl.runs(i) for i in range(6)]


def test_chat_params_reject_a_negative_prefix() -> None:
    from flatcake.traces.generator import ChatParams

    with pytest.raises(ValueError, match="prefix_tokens"):
        ChatParams(prefix_tokens=-1)
