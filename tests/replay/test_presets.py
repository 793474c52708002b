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


def test_the_qwen35_preset_replays_a_state_per_checkpoint() -> None:
    qwen = get_preset("qwen35")
    g = qwen.geometry
    assert [(grp.kind, grp.num_layers) for grp in g.layer_groups] == [("full", 10),
                                                                      ("gdn", 30)]
    # The Claude Code trace's 64-token blocks re-cut to whole 544-token checkpoints.
    blocks = g.with_block_size(g.whole_entry_tokens(64))
    assert blocks.tokens_per_block == 1088
    assert blocks.layer_block_bytes[9:11] == (1088 * 2048, 1_097_728)  # one state
    assert blocks.layer_window_blocks[9:11] == (0, 1)
    assert "gdn 30 x 1,097,728 B" in qwen.geometry_lines(64)[0]
    # The engine caches the state with prefix caching: every system stores it.
    assert qwen.node.uncached_kinds == ()
    # The largest Claude Code request (880K tokens) fits one worker's KV pool.
    assert qwen.node.gpu.kv_capacity_bytes > 880_000 * g.history_block_bytes // 544
