"""The vLLM connector refuses at start a model kind it cannot serve, naming it: several
KV cache groups (the hybrid KV cache manager on) or a spec whose pages are not one
attention layer's blocks (Mamba state). Runs where vLLM is installed (``.venv-engine``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (see scripts/engine_venv.sh)")

import torch
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

from flatcake.connectors.vllm_glue import engine_geometry, replicated_kv


def _config(*groups: KVCacheGroupSpec) -> tuple[SimpleNamespace, SimpleNamespace]:
    return (SimpleNamespace(model_config=SimpleNamespace(model="tiny"),
                            parallel_config=SimpleNamespace(decode_context_parallel_size=1)),
            SimpleNamespace(kv_cache_groups=list(groups)))


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


def test_several_groups_are_refused_naming_each_kind() -> None:
    window = SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=64,
                               dtype=torch.bfloat16, sliding_window=128)
    sliding = KVCacheGroupSpec([f"model.layers.{i}.attn" for i in range(4, 8)], window)
    with pytest.raises(ValueError, match=r"has 2: 4 layers of FullAttentionSpec \(8192 B "
                       r"pages\); 4 layers of SlidingWindowSpec \(8192 B pages, window 128 "
                       r"tokens\)\. Start vLLM with --disable-hybrid-kv-cache-manager"):
        engine_geometry(*_config(_full(4), sliding))


def test_a_state_that_is_not_attention_blocks_is_refused_by_name() -> None:
    # A test double named like vLLM's Mamba state spec.
    mamba = type("MambaSpec", (), {"page_size_bytes": 4096, "block_size": 16})()
    group = SimpleNamespace(kv_cache_spec=mamba, layer_names=["m.0"])
    with pytest.raises(ValueError, match=r"cannot store 1 layers of MambaSpec \(4096 B"):
        engine_geometry(*_config(group))
