"""The ``qwen3.5-35b-a3b`` geometry preset against what vLLM 0.32 computes for
Qwen3.5-35B-A3B (transformers' ``Qwen3_5MoeTextConfig``, whose defaults are that
checkpoint's): its layer kinds, each Gated DeltaNet layer's state (vLLM's own shape and
dtype calculators and ``MambaSpec``) and the attention block vLLM sizes to hold one
state page (``_align_hybrid_block_size``). Runs where vLLM is installed."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (see scripts/engine_venv.sh)")

import torch
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
from vllm.model_executor.layers.mamba.mamba_utils import (
    MambaStateDtypeCalculator,
    MambaStateShapeCalculator,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

from flatcake.geometry import preset, state_bytes


def test_the_preset_holds_vllms_state_and_attention_pages() -> None:
    cfg = Qwen3_5MoeTextConfig()
    g = preset("qwen3.5-35b-a3b")
    full, gdn = g.layer_groups
    assert (full.num_layers, gdn.num_layers) == (cfg.layer_types.count("full_attention"),
                                                 cfg.layer_types.count("linear_attention"))
    shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(
        1, cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
        cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim)
    dtypes = MambaStateDtypeCalculator.gated_delta_net_state_dtype(torch.bfloat16, "auto")
    spec = MambaSpec(shapes=shapes, dtypes=dtypes, block_size=g.tokens_per_block)
    assert gdn.entry_bytes == spec.page_size_bytes == state_bytes(
        shapes, [str(d).removeprefix("torch.") for d in dtypes])
    attn = FullAttentionSpec(block_size=1, num_kv_heads=cfg.num_key_value_heads,
                             head_size=cfg.head_dim, dtype=torch.bfloat16).page_size_bytes
    assert full.entry_bytes == attn
    # vLLM's attention block: the smallest multiple of the 16-token kernel block whose
    # page holds a state; the state is checkpointed every such block ("align").
    assert g.tokens_per_block == 16 * math.ceil(spec.page_size_bytes / (16 * attn)) == 544
    assert gdn.is_state and gdn.tokens_per_entry == gdn.window_tokens == 544
