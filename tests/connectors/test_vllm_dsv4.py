"""DeepSeek-V4-Flash under the vLLM connector, from the ``KVCacheConfig`` vLLM 0.32 makes
of the model's layers (``dsv4_kv``): every prefix-cacheable group is stored with its own
bytes and tokens per block (a sliding window: the engine blocks it reaches); the groups
vLLM replays itself after a hit (DeepSeek-V4.1's bounded window replay) are neither
stored nor refused; a group kind the connector does not serve is named in one refusal at
start. Runs where vLLM is installed (``.venv-engine``)."""

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
def test_each_group_is_stored_with_its_own_block_and_bytes(configs: dict, bounded: bool
                                                           ) -> None:
    stand_in, config = configs[bounded]
    g = engine_geometry(stand_in, config)
    kv = KVGroups.of(config)
    # FlatCake's block is 256 tokens: 4 blocks of the window groups, 64 and 32 of the
    # compressor states'; the scheduler half plans with group 2's (one per block).
    assert (g.tokens_per_block, kv.plan_group) == (256, 2)
    assert kv.stored == ((2, 3, 4) if bounded else (0, 1, 2, 3, 4))
    assert kv.per_block == ((1, 64, 32) if bounded else (4, 4, 1, 64, 32))
    windows = [] if bounded else [(43, 2 * 37440, 128, "sliding")]
    assert [(grp.num_layers, grp.block_bytes(256), grp.window_tokens, grp.kind)
            for grp in g.groups] == [
        *windows,
        (21, 37440, 0, "c4"), (21, 8640, 0, "c4"), (20, 1728, 0, "c128"),
        # A window keeps the engine blocks it reaches at a block's end: 2 of 4 tokens,
        # 16 of 8 tokens (vLLM frees the others).
        (21, 2 * 32832, 8, "sliding"), (21, 2 * 8640, 8, "sliding"),
        (20, 16 * 32832, 128, "sliding")]
    assert len(kv.layers) == g.num_layers == (124 if bounded else 167)
    assert kv.layers[g.num_layers - 124:][:2] == ("model.layers.2.self_attn",
                                                   "model.layers.4.self_attn")
    # Per 256 tokens of history: the compressed latents and indexer keys only.
    assert g.history_block_bytes == 21 * 37440 + 21 * 8640 + 20 * 1728


def test_a_group_kind_not_served_is_named_at_start(configs: dict) -> None:
    # A state vLLM neither prefix-caches nor replays (a ring buffer of keys being
    # compressed, vLLM's CircularBufferSpec) beside DeepSeek-V4's groups.
    import torch
    from vllm.v1.kv_cache_interface import CircularBufferSpec, KVCacheGroupSpec

    stand_in, config = configs[True]
    ring = CircularBufferSpec(block_size=8, num_kv_heads=1, head_size=512,
                              dtype=torch.float32)
    config = type(config)(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[
        *config.kv_cache_groups, KVCacheGroupSpec(["model.layers.0.ring"], ring)])
    with pytest.raises(ValueError) as info:
        engine_geometry(stand_in, config)
    message = str(info.value)
    assert message.startswith("FlatCakeConnector cannot store group 5, 1 layers of "
                              "CircularBufferSpec (32768 B pages), layer "
                              "model.layers.0.ring (not prefix-cacheable)")
    assert re.findall(r"group (\d+), \d+ layers of", message) == ["5"]
    assert message.endswith("group 0, 1 left to vLLM's bounded window replay")


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
