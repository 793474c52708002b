"""DeepSeek-V4-Flash's KV cache as vLLM 0.32 lays it out, without weights: each layer's
KV cache spec from the model's own cache modules (``vllm/v1/attention/backends/mla/
sparse_swa.py`` ``DeepseekV4SWACache``, ``vllm/models/deepseek_v4/compressor.py``
``CompressorStateCache``, ``vllm/models/deepseek_v4/attention.py``
``DeepseekV4IndexerCache``), the compressed attention layers' ``MLAAttentionSpec`` with
the numbers ``DeepseekV4Attention.get_kv_cache_spec`` gives it, then vLLM's own grouping
(``vllm/v1/core/kv_cache_utils.py`` ``get_kv_cache_groups``,
``get_kv_cache_config_from_groups``, ``resolve_kv_cache_block_sizes``).

Numbers: deepseek-ai/DeepSeek-V4-Flash ``config.json`` (43 layers: 2 sliding-window only,
then compress ratios 4 and 128 in turn, 21 and 20 layers; ``head_dim`` 512, window 128,
indexer ``head_dim`` 128), ``fp8_ds_mla`` cache, the 256-token block vLLM's DeepSeek-V4
backends take (``vllm/platforms/cpu.py``) and the block-outermost layout their indexer
asks for (``vllm/v1/attention/backends/mla/indexer.py``). Importing this module skips a
test module where vLLM (or its DeepSeek-V4 model) is missing."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (see scripts/engine_venv.sh)")
pytest.importorskip("vllm.models.deepseek_v4.compressor",
                    reason="this vLLM has no DeepSeek-V4 model")

COMPRESS_RATIOS = (0, 0) + (4, 128) * 20 + (4,)
BLOCK_SIZE = 256
HEAD_DIM = 512
WINDOW = 128
INDEX_HEAD_DIM = 128


def layer_specs(vllm_config: Any, cache_config: Any, bounded_replay: bool,
                ratios: tuple[int, ...] = COMPRESS_RATIOS) -> dict[str, Any]:
    """Each cache layer's spec, named as the model names its modules (``ratios``: each
    layer's compress ratio, 0 for a sliding-window layer)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.models.deepseek_v4.attention import DeepseekV4IndexerCache
    from vllm.models.deepseek_v4.compressor import CompressorStateCache
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    specs: dict[str, Any] = {}
    with set_current_vllm_config(vllm_config):
        for i, ratio in enumerate(ratios):
            attn = f"model.layers.{i}.self_attn"
            specs[f"{attn}.swa_cache"] = DeepseekV4SWACache(
                HEAD_DIM, WINDOW, torch.uint8, f"{attn}.swa_cache", cache_config,
                bounded_replay=bounded_replay).get_kv_cache_spec(vllm_config)
            if ratio <= 1:
                continue
            specs[attn] = MLAAttentionSpec(
                block_size=BLOCK_SIZE, num_kv_heads=1, max_tp_shards=1, head_size=HEAD_DIM,
                dtype=torch.uint8, tokens_per_state=ratio, cache_dtype_str="fp8_ds_mla",
                alignment=576, model_version="deepseek_v4", state_content_bytes=584)
            coff = 1 + (ratio == 4)
            name = f"{attn}.compressor.state_cache"
            specs[name] = CompressorStateCache(2 * coff * HEAD_DIM, torch.float32, ratio,
                                               name).get_kv_cache_spec(vllm_config)
            if ratio == 4:
                name = f"{attn}.indexer.k_cache"
                specs[name] = DeepseekV4IndexerCache(
                    INDEX_HEAD_DIM + INDEX_HEAD_DIM // 128 * 4, torch.uint8, name,
                    cache_config, ratio).get_kv_cache_spec(vllm_config)
                name = f"{attn}.indexer.compressor.state_cache"
                specs[name] = CompressorStateCache(2 * coff * INDEX_HEAD_DIM, torch.float32,
                                                   ratio, name).get_kv_cache_spec(vllm_config)
    return specs


def dsv4_flash(bounded_replay: bool, memory: int = 1 << 30,
               ratios: tuple[int, ...] = COMPRESS_RATIOS) -> tuple[Any, Any]:
    """(a vLLM config stand-in the connector reads, the ``KVCacheConfig`` vLLM makes of
    DeepSeek-V4-Flash's layers): ``bounded_replay`` as DeepSeek-V4.1 runs by default
    (``--swa-bounded-replay``: the sliding-window groups are not prefix-cacheable);
    ``ratios``: fewer layers of the same kinds, for a paged KV that fits a test."""
    from vllm.config import CacheConfig, VllmConfig
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
    from vllm.v1.core.kv_cache_utils import (
        get_kv_cache_config_from_groups,
        get_kv_cache_groups,
        resolve_kv_cache_block_sizes,
    )

    cache = CacheConfig(block_size=BLOCK_SIZE, cache_dtype="fp8_ds_mla",
                        enable_prefix_caching=True)
    vllm_config = VllmConfig(cache_config=cache)
    specs = layer_specs(vllm_config, cache, bounded_replay, ratios)
    resolve_kv_cache_layout(vllm_config, [["BLHNC", "BLNHC"]], specs.values())
    groups = get_kv_cache_groups(vllm_config, dict(specs))
    config = get_kv_cache_config_from_groups(vllm_config, groups, memory)
    _, config.hash_block_size = resolve_kv_cache_block_sizes(config, vllm_config)
    stand_in = SimpleNamespace(
        model_config=SimpleNamespace(model="deepseek-ai/DeepSeek-V4-Flash"),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1,
                                        tensor_parallel_size=1))
    return stand_in, config
