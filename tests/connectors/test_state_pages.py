"""A recurrent state's engine pages (vLLM's ``MambaSpec`` under the hybrid KV cache
manager): each page holds the state's arrays first, then padding up to the attention
page; FlatCake keeps the arrays alone (``EnginePages.content``), takes the state of a
block from its group's slot at that block only (the rest of the group's list is the
null block), and writes a restored state into the arrays of its slot, the padding
untouched."""

from __future__ import annotations

import pytest
import torch

from flatcake.cio.paged import PagedKV
from flatcake.connectors.group_slots import EnginePages, GroupedKV

SLOTS, ATTN, PAGE, STATE = 64, 128, 512, 200


def engine() -> tuple[list[torch.Tensor], GroupedKV]:
    """One attention layer (group 0) and one state layer (group 1) whose 512 B pages
    hold a 200 B state: a window of one block."""
    gen = torch.Generator().manual_seed(7)
    kv = [torch.randint(0, 256, (SLOTS, size), generator=gen, dtype=torch.uint8)
          for size in (ATTN, PAGE)]
    grouped = GroupedKV(PagedKV(kv, (ATTN, PAGE)), (0, 1), window_blocks=(0, 1),
                        pages=(EnginePages(ATTN), EnginePages(PAGE, content=STATE)))
    return kv, grouped


def test_a_state_is_stored_without_its_padding_and_restored_into_its_arrays() -> None:
    kv, grouped = engine()
    scratch = grouped.snapshot(((5, 6, 7), (0, 0, 40)), 3)
    assert scratch is not None
    layers = scratch.layer_bytes()
    assert layers[0].numel() == 3 * ATTN and layers[1].numel() == 3 * STATE
    assert bytes(layers[0].numpy()) == bytes(kv[0][[5, 6, 7]].numpy())
    assert bytes(layers[1][2 * STATE:].numpy()) == bytes(kv[1][40][:STATE].numpy())
    pad = kv[1][50][STATE:].clone()
    before = kv[1].clone()
    grouped.scatter(scratch, ((10, 11, 12), (0, 0, 50)), 0, 3)
    assert bytes(kv[0][[10, 11, 12]].numpy()) == bytes(kv[0][[5, 6, 7]].numpy())
    assert bytes(kv[1][50][:STATE].numpy()) == bytes(kv[1][40][:STATE].numpy())
    assert torch.equal(kv[1][50][STATE:], pad)
    changed = (kv[1] != before).any(dim=1).nonzero().flatten().tolist()
    assert changed == [50]  # the null block and every other slot untouched


def test_a_segment_whose_end_state_is_not_held_is_not_stored() -> None:
    _, grouped = engine()
    assert grouped.snapshot(((5, 6, 7), (0, 40, 0)), 3) is None


def test_a_page_head_moves_alone_only_in_the_blocks_layout() -> None:
    kv, grouped = engine()
    table = grouped.paged.block_table([3, 4], unique=True)
    out = torch.empty(2 * STATE, dtype=torch.uint8)
    grouped.paged.gather(1, table, out, head=STATE)
    assert bytes(out.numpy()) == bytes(kv[1][[3, 4], :STATE].numpy())
    with pytest.raises(ValueError, match="first 600 bytes of a 512 B block"):
        grouped.paged.gather(1, table, torch.empty(1200, dtype=torch.uint8), head=600)
    halves = PagedKV([torch.zeros(2, SLOTS, 64, dtype=torch.uint8)], 128,
                     kv_layout="kv_blocks")
    with pytest.raises(ValueError, match="'kv_blocks' layout"):
        halves.scatter(0, table, torch.zeros(2 * 32, dtype=torch.uint8), head=32)
    with pytest.raises(ValueError, match="content"):
        EnginePages(PAGE, content=PAGE + 1)
