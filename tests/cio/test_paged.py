"""Paged KV adapter: byte-exact gather/scatter for both layouts; input validation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flatcake.cio.paged import PagedKV

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.uint8]


def _caches(layout: str, num_layers: int, num_blocks: int, inner_bytes: int,
            dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    """Random bytes viewed as ``dtype``: (num_blocks, 3, elems) or (2, num_blocks, 3, elems)."""
    g = torch.Generator().manual_seed(seed)
    shape = (num_blocks, 3, inner_bytes) if layout == "blocks" else (2, num_blocks, 3,
                                                                      inner_bytes)
    return [torch.randint(0, 256, shape, dtype=torch.uint8, generator=g).view(dtype)
            for _ in range(num_layers)]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


@settings(max_examples=40, deadline=None)
@given(layout=st.sampled_from(["blocks", "kv_blocks"]), num_layers=st.integers(1, 4),
       num_blocks=st.integers(1, 12), elems=st.integers(1, 8),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 1000), data=st.data())
def test_gather_then_scatter_moves_exact_bytes(layout: str, num_layers: int,
                                              num_blocks: int, elems: int,
                                              dtype: torch.dtype, seed: int,
                                              data: st.DataObject) -> None:
    size = torch.tensor([], dtype=dtype).element_size()
    src = _caches(layout, num_layers, num_blocks, elems * size, dtype, seed)
    per_block = src[0].numel() * src[0].element_size() // num_blocks
    paged_src = PagedKV(src, per_block, layout)
    n = data.draw(st.integers(0, num_blocks))
    src_ids = data.draw(st.permutations(range(num_blocks)))[:n]
    dst_ids = data.draw(st.permutations(range(num_blocks)))[:n]
    dst = [torch.zeros_like(t) for t in src]
    paged_dst = PagedKV(dst, per_block, layout)
    for layer in range(num_layers):
        buf = torch.empty(n * per_block, dtype=torch.uint8)
        paged_src.gather(layer, paged_src.block_table(src_ids, unique=False), buf)
        paged_dst.scatter(layer, paged_dst.block_table(dst_ids, unique=True), buf)
    dim = 0 if layout == "blocks" else 1
    for layer in range(num_layers):
        for s, d in zip(src_ids, dst_ids, strict=True):
            assert torch.equal(_bytes(src[layer].select(dim, s)),
                               _bytes(dst[layer].select(dim, d)))
        untouched = sorted(set(range(num_blocks)) - set(dst_ids))
        for d in untouched:
            assert not _bytes(dst[layer].select(dim, d)).any()


def test_kv_blocks_block_is_k_then_v() -> None:
    k = torch.arange(4 * 6, dtype=torch.uint8).view(4, 6)
    v = k + 100
    paged = PagedKV([torch.stack([k, v])], 12, "kv_blocks")
    out = torch.empty(12, dtype=torch.uint8)
    paged.gather(0, paged.block_table([2], unique=False), out)
    assert out.tolist() == k[2].tolist() + v[2].tolist()


def test_auto_layout_detection() -> None:
    assert PagedKV([torch.zeros(2, 5, 8)], 2 * 8 * 4, "auto").kv_layout == "kv_blocks"
    assert PagedKV([torch.zeros(5, 2, 8)], 2 * 8 * 4, "auto").kv_layout == "blocks"
    with pytest.raises(ValueError, match="ambiguous"):
        PagedKV([torch.zeros(2, 2, 8)], 2 * 8 * 4, "auto")


@pytest.mark.parametrize(
    ("caches", "bbpl", "needle"),
    [
        ([], 4, "non-empty"),
        ([torch.zeros(4, 8), torch.zeros(4, 9)], 32, r"kv_caches\[1\].*shape"),
        ([torch.zeros(4, 8), torch.zeros(4, 8, dtype=torch.float16)], 32,
         r"kv_caches\[1\].*dtype"),
        ([torch.zeros(8, 4).t()], 32, r"kv_caches\[0\] must be contiguous"),
        ([torch.zeros(4, 8)], 64, "block_bytes_per_layer=64"),
    ],
)
def test_bad_caches_named(caches: list[torch.Tensor], bbpl: int, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        PagedKV(caches, bbpl)


def test_bad_block_tables_named() -> None:
    paged = PagedKV([torch.zeros(4, 8)], 32)
    with pytest.raises(ValueError, match="block_ids contains 4"):
        paged.block_table([0, 4], unique=False)
    with pytest.raises(ValueError, match="block_ids contains -1"):
        paged.block_table([-1], unique=False)
    with pytest.raises(ValueError, match="repeats"):
        paged.block_table([1, 1], unique=True)
    with pytest.raises(ValueError, match="1-D"):
        paged.block_table([[1]], unique=False)
    with pytest.raises(ValueError, match="integers"):
        paged.block_table([1.5], unique=False)
    with pytest.raises(ValueError, match="layer"):
        paged.scatter(1, paged.block_table([0], unique=True), torch.zeros(32, dtype=torch.uint8))
    with pytest.raises(ValueError, match="32 bytes"):
        paged.scatter(0, paged.block_table([0], unique=True), torch.zeros(8, dtype=torch.uint8))


@pytest.mark.parametrize("pool_layout", ["layer_first", "page_first_direct"])
def test_strided_kv_blocks_are_one_layer_of_an_interleaved_pool(pool_layout: str) -> None:
    """A host pool that interleaves layers (SGLang's ``layer_first`` (2, L, P, part),
    ``page_first_direct`` (2, P, L, part)): each layer is a strided ``kv_blocks`` view;
    gather, scatter and the byte spans address exactly that layer's block halves."""
    layers, pages, part = 3, 5, 16
    shape = (2, layers, pages, part) if pool_layout == "layer_first" else (2, pages, layers, part)
    pool = torch.randint(0, 256, shape, dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(3))
    caches = ([pool[:, la] for la in range(layers)] if pool_layout == "layer_first"
              else [pool[:, :, la] for la in range(layers)])
    paged = PagedKV(caches, 2 * part)  # auto: a strided tensor is kv_blocks
    assert (paged.kv_layout, paged.contiguous, paged.part_bytes) == ("kv_blocks", False, part)
    ids = torch.tensor([4, 0, 2])
    out = torch.empty(3 * 2 * part, dtype=torch.uint8)
    paged.gather(1, ids, out)
    assert torch.equal(out.view(3, 2, part), caches[1][:, ids].permute(1, 0, 2))
    span = paged.layer_bytes()[1]
    k_at, v_at = 2 * paged.block_stride, paged.plane_stride + 2 * paged.block_stride
    assert torch.equal(span[k_at:k_at + part], caches[1][0, 2])
    assert torch.equal(span[v_at:v_at + part], caches[1][1, 2])
    before = pool.clone()
    paged.scatter(2, torch.tensor([3]), torch.arange(2 * part, dtype=torch.uint8))
    changed = (pool != before).nonzero().tolist()
    want_layer = [c[1 if pool_layout == "layer_first" else 2] for c in changed]
    assert set(want_layer) == {2} and len(changed) <= 2 * part
    assert torch.equal(caches[2][:, 3].reshape(-1), torch.arange(2 * part, dtype=torch.uint8))
