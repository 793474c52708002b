"""Preset overrides used by the sensitivity sweeps."""

from __future__ import annotations

import pytest

from flatcake.replay.devices import GIB
from flatcake.replay.presets import get_preset
from flatcake.replay.report import sensitivity_table
from flatcake.replay.sweep import SweepResult


def test_with_node_replaces_the_gpu_pool_only() -> None:
    paper = get_preset("paper")
    small = paper.with_node(gpu_kv_capacity_bytes=3 * GIB)
    assert small.node.gpu.kv_capacity_bytes == 3 * GIB
    assert small.node.gpu.prefill_tokens_per_s == paper.node.gpu.prefill_tokens_per_s
    assert small.node.host_memory_bytes == paper.node.host_memory_bytes
    both = paper.with_node(gpu_kv_capacity_bytes=12 * GIB, host_memory_bytes=32 * GIB)
    assert (both.node.gpu.kv_capacity_bytes, both.node.host_memory_bytes) == (12 * GIB,
                                                                             32 * GIB)
    with pytest.raises(ValueError, match="kv_capacity_bytes"):
        paper.with_node(gpu_kv_capacity_bytes=0)


def test_sensitivity_table_names_the_budget() -> None:
    run = {"system": "flatcake", "rate_req_s": 1.0, "hit_rate_gpu": 0.9, "ttft_mean_s": 0.3,
           "ttft_p99_s": 2.0}
    res = SweepResult([run], {"systems": ["flatcake"], "rates": [1.0]})
    lines = sensitivity_table({3: res}, "GPU KV pool per worker", "GPU KV pool")
    assert lines[0].startswith("## GPU KV pool (every system, 1 req/s")
    assert "| 3 GiB | 90.00% / 0.300 / 2.000 s |" in lines
