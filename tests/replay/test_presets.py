"""Preset overrides used by the sensitivity sweeps."""

from __future__ import annotations

import pytest

from flatcake.replay.node.devices import GIB
from flatcake.replay.presets import get_preset


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
