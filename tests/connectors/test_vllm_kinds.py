"""The vLLM connector maps the engine's KV cache groups to FlatCake's layer groups and
refuses at start a model kind it cannot serve, naming it: a spec whose pages are not one
attention layer's blocks, or a Mamba state vLLM does not checkpoint (mamba_cache_mode
other than "align"). Runs where
vLLM is installed (``.venv-engine``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (see scripts/engine_venv.sh)")

import torch
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

from flatcake.connectors.vllm_glue import KVGroups, engine_geometry, replicated_kv


def _config(*groups: KVCacheGroupSpec) -> tuple[SimpleNamespace, KVCacheConfig]:
    return (SimpleNamespace(model_config=SimpleNamespace(model="tiny"),
                            parallel_config=SimpleNamespace(decode_context_parallel_size=1)),
            KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=list(groups)))


def _full(n: int) -> KVCacheGroupSpec:
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64,
                             dtype=torch.bfloat16)
    return KVCacheGroupSpec([f"model.layers.{i}.attn" for i in range(n)], spec)


def test_one_full_attention_group_is_served() -> None:
    g = engine_geometry(*_config(_full(4)))
    assert (g.num_layers, g.block_bytes_per_layer) == (4, 16 * 2 * 2 * 64 * 2)


def test_mla_is_served_as_its_latent() -> None:
    # DeepSeek-V2/V3: one latent (kv_lora_rank 512 + rope 64) per token and layer.
    spec = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576,
                            dtype=torch.bfloat16)
    group = KVCacheGroupSpec([f"model.layers.{i}.self_attn.attn" for i in range(3)], spec)
    g = engine_geometry(*_config(group))
    assert (g.num_layers, g.num_kv_heads, g.mla_latent_dim) == (3, 0, 576)
    assert g.layer_block_bytes == (spec.page_size_bytes,) * 3 == (16 * 576 * 2,) * 3
    # The same latent on every tensor-parallel rank: one part, written once.
    assert replicated_kv(*_config(group)) and not replicated_kv(*_config(_full(2)))


def _sliding(first: int, n: int) -> KVCacheGroupSpec:
    window = SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=64,
                               dtype=torch.bfloat16, sliding_window=128)
    return KVCacheGroupSpec([f"model.layers.{i}.attn" for i in range(first, first + n)],
                            window)


def test_several_groups_are_one_layer_group_each_in_group_order() -> None:
    config = _config(_full(2), _sliding(2, 3))
    g = engine_geometry(*config)
    assert [(grp.num_layers, grp.entry_bytes, grp.window_tokens, grp.kind)
            for grp in g.groups] == [(2, 512, 0, "full"), (3, 512, 128, "sliding")]
    assert g.layer_block_bytes == (8192,) * 5 and g.tokens_per_block == 16
    kv = KVGroups.of(config[1])
    assert kv.stored == (0, 1) and kv.layer_group == (0, 0, 1, 1, 1)
    assert kv.layers[:3] == ("model.layers.0.attn", "model.layers.1.attn",
                             "model.layers.2.attn")


def test_a_mamba_group_without_checkpoints_is_refused_by_name() -> None:
    from vllm.v1.kv_cache_interface import MambaSpec

    # mamba_cache_mode "none" (vLLM's prefix cache off): no state at block boundaries.
    mamba = MambaSpec(block_size=16, shapes=((3, 8), (2, 4, 4)),
                      dtypes=(torch.bfloat16, torch.float32), mamba_cache_mode="none")
    group = KVCacheGroupSpec(["model.layers.5.mixer", "model.layers.6.mixer"], mamba)
    with pytest.raises(ValueError) as err:
        engine_geometry(*_config(_full(2), group))
    # The layer and its spec are named: the state's arrays, dtypes and cache mode.
    assert ("cannot store group 1, 2 layers of MambaSpec (176 B pages, state 3x8 "
            "bfloat16, 2x4x4 float32, mamba_cache_mode none), layer "
            "model.layers.5.mixer and 1 more") in str(err.value)
    assert "as vLLM's prefix cache checkpoints it (mamba_cache_mode 'align'" \
        in str(err.value)


def test_a_state_that_is_not_attention_blocks_is_refused_by_name() -> None:
    # A test double named like vLLM's Mamba state spec.
    mamba = type("MambaSpec", (), {"page_size_bytes": 4096, "block_size": 16})()
    group = SimpleNamespace(kv_cache_spec=mamba, layer_names=["m.0"])
    with pytest.raises(ValueError, match=r"cannot store 1 layers of MambaSpec \(4096 B"):
        engine_geometry(*_config(group))
