"""DeepSeek-V4-Flash under the vLLM connector, from the ``KVCacheConfig`` vLLM 0.32 makes
of the model's layers (``dsv4_kv``): the groups vLLM replays itself after a hit
(DeepSeek-V4.1's bounded window replay) are neither stored nor refused; every group
kind the connector does not serve yet is named in one refusal at start. Runs where vLLM
is installed (``.venv-engine``)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from tests.connectors.dsv4_kv import dsv4_flash

pytest.importorskip("vllm")

from flatcake.connectors.vllm_glue import KVGroups, engine_geometry, replayed_by_engine


@pytest.fixture(scope="module")
def configs() -> dict[bool, tuple[object, object]]:
    return {bounded: dsv4_flash(bounded) for bounded in (False, True)}


def test_vllm_makes_five_groups_of_four_block_sizes(configs: dict) -> None:
    for bounded, (_, config) in configs.items():
        groups = config.kv_cache_groups
        assert [len(g.layer_names) for g in groups] == [22, 21, 62, 42, 20]
        assert [g.kv_cache_spec.block_size for g in groups] == [64, 64, 256, 4, 8]
        assert config.transfer_group_ids == (0, 1, 2, 3, 4)
        assert config.prefix_cacheable_group_ids == ((2, 3, 4) if bounded else
                                                     (0, 1, 2, 3, 4))
        assert [replayed_by_engine(g.kv_cache_spec) for g in groups] == \
            [bounded, bounded, False, False, False]
        # An MLA layer and its indexer share one group, beside the 128x layers.
        mla = groups[2].kv_cache_spec.kv_cache_specs
        assert sorted({(s.tokens_per_state, s.page_size_bytes) for s in mla.values()}) == \
            [(4, 8640), (4, 37440), (128, 1728)]


@pytest.mark.parametrize("bounded", [False, True])
def test_every_group_not_served_is_named_at_start(configs: dict, bounded: bool) -> None:
    stand_in, config = configs[bounded]
    with pytest.raises(ValueError) as info:
        engine_geometry(stand_in, config)
    message = str(info.value)
    named = [int(g) for g in re.findall(r"group (\d+), \d+ layers of", message)]
    # The sliding-window groups vLLM replays are left to it, not refused.
    assert named == ([2, 3, 4] if bounded else [0, 1, 2, 3, 4])
    assert ("group 0, 1 left to vLLM's bounded window replay" in message) == bounded
    assert "62 layers of UniformTypeKVCacheSpecs in 256-token blocks: " in message
    assert "42 x MLAAttentionSpec (37440 B pages, one state per 4 tokens)" not in message
    assert "21 x MLAAttentionSpec (37440 B pages, one state per 4 tokens)" in message
    assert "20 x MLAAttentionSpec (1728 B pages, one state per 128 tokens)" in message
    assert "21 x MLAAttentionSpec (8640 B pages, one state per 4 tokens)" in message
    assert "SlidingWindowMLASpec (32832 B pages, window 8 tokens)" in message
    assert message.startswith("FlatCakeConnector cannot store ")
    with pytest.raises(ValueError, match=re.escape(message)):
        KVGroups.of(config)


def test_a_group_vllm_replays_is_left_to_it_and_the_others_are_stored() -> None:
    # A bounded-replay window beside an MLA group of the same block size: vLLM rebuilds
    # the window after a hit (its scheduler recomputes the hit's last window when the
    # connector's load does not restore that group), so FlatCake stores group 0 only.
    import torch
    from vllm.v1.kv_cache_interface import (
        KVCacheConfig,
        KVCacheGroupSpec,
        MLAAttentionSpec,
        SlidingWindowMLASpec,
    )

    mla = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576,
                           dtype=torch.bfloat16)
    window = SlidingWindowMLASpec(block_size=16, num_kv_heads=1, head_size=576,
                                  dtype=torch.bfloat16, sliding_window=32,
                                  bounded_replay=True)
    config = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec([f"model.layers.{i}.attn" for i in (0, 2)], mla),
        KVCacheGroupSpec([f"model.layers.{i}.swa" for i in (0, 1, 2)], window)])
    kv = KVGroups.of(config)
    assert (kv.stored, kv.layers, kv.layer_group) == (
        (0,), ("model.layers.0.attn", "model.layers.2.attn"), (0, 0))
    vllm_config = SimpleNamespace(model_config=SimpleNamespace(model="tiny"),
                           parallel_config=SimpleNamespace(decode_context_parallel_size=1))
    g = engine_geometry(vllm_config, config)
    assert (g.num_layers, g.layer_block_bytes) == (2, (16 * 576 * 2,) * 2)
