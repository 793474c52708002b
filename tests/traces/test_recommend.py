"""Advice from the analysis: memory arithmetic, SSD on the read path, thresholds."""

from __future__ import annotations

import numpy as np
import pytest

from flatcake.config import GIB, PlacementConfig
from flatcake.geometry import preset
from flatcake.traces import TraceAnalysis, analyze_trace, build_trace, recommend

GEOM = preset("llama-3.1-8b")  # 128 KiB per token, 16-token blocks


def _sessions(contexts: list[int]) -> TraceAnalysis:
    """One request per session with the given context; ids disjoint (all used once)."""
    counts = [c // 16 for c in contexts]
    ids = np.arange(sum(counts), dtype=np.int64)
    return analyze_trace(build_trace(
        name="r", source_format="test", block_size_tokens=16, clock="session",
        has_hashes=True, partial_last_block=False, time_s=[0.0] * len(contexts),
        input_tokens=contexts, output_tokens=[100] * (len(contexts) - 1) + [4000],
        block_counts=counts, block_hashes=ids, session=list(range(len(contexts))),
        session_names=[f"s{i}" for i in range(len(contexts))]), GEOM)


def test_sessions_that_do_not_fit_put_the_ssd_on_the_read_path() -> None:
    # 8192 tokens of KV = 1 GiB each; 3 sessions, 2 GiB of memory holds 2.
    analysis = _sessions([8192, 8192, 8192])
    rec = recommend(analysis, GEOM, 2 * GIB, PlacementConfig(short_reply_threshold_tokens=512),
                    memory_sessions=4)
    assert rec.sessions_in_memory == 2 and rec.ssd_on_read_path is True
    text = "\n".join(rec.lines)
    assert "Sessions average 1.00 GiB" in text
    assert "expect the SSD on the read path" in text
    assert "used exactly once" in text  # all blocks are read once here
    # 2 GiB / (4 sessions x 128 KiB per token) = 4096 tokens, a multiple of 16.
    assert rec.placement["agent_context_threshold_tokens"] == 4096
    assert "100% of this trace's sessions are longer" in text
    assert "67% of replies are at most short_reply_threshold_tokens = 512" in text
    assert "33% exceed long_reply_threshold_tokens = 2048" in text


def test_memory_that_holds_everything_says_so() -> None:
    rec = recommend(_sessions([8192, 8192]), GEOM, 64 * GIB, PlacementConfig())
    assert rec.ssd_on_read_path is False and rec.sessions_in_memory == 64
    assert any("capacity backstop" in line for line in rec.lines)


def test_memory_smaller_than_one_session() -> None:
    rec = recommend(_sessions([8192]), GEOM, GIB // 2, PlacementConfig())
    assert rec.sessions_in_memory == 0
    assert any("cannot hold one average session" in line for line in rec.lines)


def test_lengths_only_trace_says_prefix_statistics_are_unavailable() -> None:
    analysis = analyze_trace(build_trace(
        name="len", source_format="test", block_size_tokens=16, clock="global",
        has_hashes=False, partial_last_block=False, time_s=[0, 1],
        input_tokens=[1000, 3000], output_tokens=[10, 20], block_counts=[0, 0],
        block_hashes=np.zeros(0, dtype=np.int64)), GEOM)
    rec = recommend(analysis, GEOM, 4 * GIB, PlacementConfig())
    assert "no block hashes" in rec.lines[0]
    assert rec.sessions_in_memory is None


@pytest.mark.parametrize("kwargs", [{"memory_sessions": 0}, {"ssd_read_gbps": 0.0}])
def test_bad_arguments(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        recommend(_sessions([64]), GEOM, GIB, PlacementConfig(), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="memory_bytes"):
        recommend(_sessions([64]), GEOM, 0, PlacementConfig())
