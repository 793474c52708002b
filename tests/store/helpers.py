"""Builders shared by the store tests: small geometries, configs and paged KV caches."""

from __future__ import annotations

from pathlib import Path

import torch

from flatcake.cio.direct import aligned_buffer
from flatcake.cio.files import SESSIONS_DIR
from flatcake.cio.filescan import scan_session_file
from flatcake.config import FlatCakeConfig, load_config
from flatcake.control.keys import chain_block_keys
from flatcake.geometry import KVGeometry, LayerGroup
from flatcake.store import FlatCakeStore, TurnSignals
from tests.cio.helpers import flip_byte

SMALL = KVGeometry(num_layers=3, tokens_per_block=4, num_kv_heads=2, head_dim=8,
                   dtype="float16", name="small")  # 256 bytes per block per layer

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16,
                "float32": torch.float32, "uint8": torch.uint8, "int8": torch.int8}

# Placement signals that force each medium (see control.placement).
TO_SSD = TurnSignals(turn_index=0, context_tokens=0)
TO_MEMORY = TurnSignals(turn_index=1, context_tokens=0, prev_reply_tokens=1)


def small_config(*overrides: str) -> FlatCakeConfig:
    # The short-reply rule on and no memory copies, so that TO_MEMORY lands in memory
    # and SSD turns are read from SSD (tests/store/test_memory_copies.py turns copies on).
    base = ["store.memory_capacity_bytes=4194304", "store.ssd_capacity_bytes=268435456",
            "store.session_file_bytes=16777216", "placement.short_reply_threshold_tokens=512",
            "placement.memory_copy_watermark=0"]
    return load_config(env={}, overrides=[*base, *overrides])


def kv_shape(g: KVGeometry, num_slots: int, layout: str) -> tuple[int, ...]:
    if g.is_mla:
        return (num_slots, g.tokens_per_block, g.mla_latent_dim)
    if layout == "kv_blocks":
        return (2, num_slots, g.tokens_per_block, g.num_kv_heads, g.head_dim)
    return (num_slots, 2, g.tokens_per_block, g.num_kv_heads, g.head_dim)


def random_kv(g: KVGeometry, num_slots: int, layout: str = "kv_blocks",
              seed: int = 0) -> list[torch.Tensor]:
    """Random bytes in the engine's paged layout, one tensor per layer."""
    gen = torch.Generator().manual_seed(seed)
    shape = kv_shape(g, num_slots, layout)
    dtype = TORCH_DTYPES[g.dtype]
    out = []
    for _ in range(g.num_layers):
        raw = torch.randint(0, 256, (*shape[:-1], shape[-1] * g.dtype_bytes),
                            dtype=torch.uint8, generator=gen)
        out.append(raw.view(dtype))
    return out


def empty_kv(g: KVGeometry, num_slots: int, layout: str = "kv_blocks") -> list[torch.Tensor]:
    return [torch.zeros(kv_shape(g, num_slots, layout), dtype=TORCH_DTYPES[g.dtype])
            for _ in range(g.num_layers)]


def block_bytes(kv: list[torch.Tensor], layer: int, slot: int, layout: str) -> bytes:
    """The opaque bytes of one block of one layer, as the store sees them."""
    t = kv[layer]
    part = t[:, slot] if layout == "kv_blocks" else t[slot]
    return part.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def session_keys(session: int, num_blocks: int, g: KVGeometry = SMALL) -> list[bytes]:
    return branch_keys(session, num_blocks, session, num_blocks, g)


def branch_keys(session: int, num_shared: int, branch: int, num_blocks: int,
                g: KVGeometry = SMALL) -> list[bytes]:
    """Keys of a prompt of ``num_blocks`` blocks that shares its first ``num_shared``
    with ``session_keys(session, ...)`` and goes on with ``branch``'s tokens."""
    tpb = g.tokens_per_block
    tokens = [session * 1_000_003 + i for i in range(num_shared * tpb)]
    tokens += [branch * 1_000_003 + i for i in range(num_shared * tpb, num_blocks * tpb)]
    return chain_block_keys(tokens, tpb, "test-model")


# Full-attention layers (8 KiB a block), compressed layers keeping one 1 KiB entry per 4
# tokens (4 KiB a block) and layers keeping one 584 B entry per block (not a multiple of
# 4 KiB: no O_DIRECT read can land in their slots).
THREE_KINDS = KVGeometry(
    num_layers=5, tokens_per_block=16, dtype="uint8", name="three-kinds",
    groups=(LayerGroup(2, 512, kind="full"), LayerGroup(1, 1024, tokens_per_entry=4, kind="c4a"),
            LayerGroup(2, 584, tokens_per_entry=16, kind="c16")))
# The same kinds with 4 KiB-multiple blocks only: zero-copy reads serve every layer.
ALIGNED_KINDS = KVGeometry(
    num_layers=4, tokens_per_block=16, dtype="uint8", name="aligned-kinds",
    groups=(LayerGroup(1, 512), LayerGroup(2, 1024, tokens_per_entry=4, kind="c4a"),
            LayerGroup(1, 3072, tokens_per_entry=4, kind="c4b")))


def rot_last_segment(root: Path, layer: int, byte: int) -> None:
    """Flip one bit of byte ``byte`` of ``layer`` in the last segment of the store's one
    session file."""
    (path,) = sorted((root / SESSIONS_DIR).iterdir())
    _, segs, _ = scan_session_file(path)
    flip_byte(str(path), segs[-1].file_offset + segs[-1].header.layout.layer_offset(layer)
              + byte)


def paged(g: KVGeometry, slots: int, seed: int | None = None) -> list[torch.Tensor]:
    """One ``(slots, block bytes)`` tensor per layer, 4 KiB aligned; random or zero."""
    gen = torch.Generator().manual_seed(seed or 0)
    out = []
    for size in g.layer_block_bytes:
        t = aligned_buffer(slots * size, pin=False).view(slots, size)
        if seed is None:
            t.zero_()
        else:
            t.copy_(torch.randint(0, 256, (slots, size), dtype=torch.uint8, generator=gen))
        out.append(t)
    return out


def store_three_turns(store: FlatCakeStore, keys: list[bytes], src: list[torch.Tensor]
                      ) -> None:
    # Turn 0 (blocks 0-4) and turn 2 (blocks 8-11) on SSD, turn 1 (blocks 5-7) in memory.
    store.store_turn("s", keys[:5], src, range(5), TO_SSD)
    store.store_turn("s", keys[:8], src, range(8), TurnSignals(
        turn_index=1, context_tokens=80, prev_reply_tokens=TO_MEMORY.prev_reply_tokens))
    store.store_turn("s", keys, src, range(12), TurnSignals(turn_index=2,
                                                             context_tokens=0))
