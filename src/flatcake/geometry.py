"""KV-cache geometry: how many bytes one block of each layer takes.

FlatCake treats a block's KV as opaque bytes; geometry only fixes sizes. A block
(``tokens_per_block`` tokens, one key) of layer ``l`` holds those tokens' K and V (or,
for MLA models, the compressed latent), so for a model whose layers are alike

    block_bytes_per_layer = tokens_per_block * bytes_per_token_per_layer

A model whose layers differ (sliding-window and full attention of other shapes,
compressed layers keeping one entry per several tokens) lists its ``LayerGroup``s in
layer order; each group has its own bytes per block (``layer_block_bytes``) and its
own rule for what a next turn reads (``window_tokens``).

A state-space layer (Mamba-2, Gated DeltaNet) keeps no per-token entries but one
fixed-size recurrent state (a conv state and an SSM state, ``state_bytes``) as of a
position; the engine checkpoints it every ``checkpoint_tokens`` (vLLM's Mamba block in
``mamba_cache_mode = "align"``). Its group is a window of one checkpoint
(``LayerGroup.state``): the next turn reads the state at the hit's end only, so a hit
may end only where that state is held.

Presets name the public model config they come from.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "uint8": 1,
    "int8": 1,
}


def state_bytes(shapes: Sequence[Sequence[int]], dtypes: Sequence[str]) -> int:
    """Bytes of one layer's recurrent state: each array's elements times its dtype's
    size, summed (vLLM's ``MambaSpec.state_content_size_bytes``, before page padding)."""
    if not shapes or len(shapes) != len(dtypes):
        raise ValueError(f"a state needs one dtype per shape, got shapes {shapes!r}, "
                         f"dtypes {dtypes!r}")
    total = 0
    for shape, dtype in zip(shapes, dtypes, strict=True):
        if dtype not in DTYPE_BYTES or not shape or min(shape) <= 0:
            raise ValueError(f"a state array needs a positive shape and a dtype of "
                             f"{sorted(DTYPE_BYTES)}, got {tuple(shape)!r} {dtype!r}")
        total += math.prod(shape) * DTYPE_BYTES[dtype]
    return total


@dataclass(frozen=True, slots=True)
class LayerGroup:
    """Consecutive layers of one kind, each keeping ``entry_bytes`` per
    ``tokens_per_entry`` tokens.

    Attributes:
        num_layers: layers in the group.
        entry_bytes: bytes of one cache entry of one layer (K and V of one token for
            plain attention; a compressed entry for compressed layers).
        tokens_per_entry: tokens one entry covers (1, or a compression ratio); the
            group's own block is ``tokens_per_entry`` x the model's block in tokens.
        window_tokens: a sliding window: the next turn reads only the last
            ``window_tokens`` tokens of these layers; 0 keeps the whole history.
        kind: a name for reports ("full", "sliding", "c4a", ...).
        window_bytes: a windowed group seen at a block coarser than the engine's page
            (a trace of 512-token blocks over an engine of 128-token pages): the bytes
            one layer holds per block, the engine's pages of the window as of the
            block's end, not the block's every token (``KVGeometry.with_block_size``);
            0: the block's own bytes.
    """

    num_layers: int
    entry_bytes: int
    tokens_per_entry: int = 1
    window_tokens: int = 0
    kind: str = "full"
    window_bytes: int = 0

    def __post_init__(self) -> None:
        for field_name in ("num_layers", "entry_bytes", "tokens_per_entry",
                           "window_tokens", "window_bytes"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"LayerGroup.{field_name} must be an int, got {value!r}")
        for field_name in ("num_layers", "entry_bytes", "tokens_per_entry"):
            if getattr(self, field_name) <= 0:
                raise ValueError(f"LayerGroup.{field_name} must be > 0, got "
                                 f"{getattr(self, field_name)!r}")
        if self.window_tokens < 0:
            raise ValueError(f"LayerGroup.window_tokens must be >= 0, got "
                             f"{self.window_tokens!r}")
        if self.window_bytes < 0 or (self.window_bytes and not self.window_tokens):
            raise ValueError(f"LayerGroup.window_bytes must be >= 0, and 0 without a "
                             f"window, got {self.window_bytes!r}")

    @classmethod
    def state(cls, num_layers: int, shapes: Sequence[Sequence[int]],
              dtypes: Sequence[str], checkpoint_tokens: int, kind: str = "state"
              ) -> LayerGroup:
        """State-space layers (Mamba-2, Gated DeltaNet): one state of ``shapes`` and
        ``dtypes`` (vLLM's ``MambaSpec``: conv state, SSM state) per layer, checkpointed
        every ``checkpoint_tokens`` tokens; a window of one checkpoint, so a segment holds
        the state at each of its hit ends (``layout.SegmentLayout.ends``) and its end."""
        return cls(num_layers, state_bytes(shapes, dtypes),
                   tokens_per_entry=checkpoint_tokens, window_tokens=checkpoint_tokens,
                   kind=kind)

    @property
    def is_state(self) -> bool:
        """A recurrent state: the window is one entry, the state as of its end."""
        return self.window_tokens == self.tokens_per_entry > 1

    def block_bytes(self, tokens_per_block: int) -> int:
        """Bytes of one model block (``tokens_per_block`` tokens) of one layer."""
        if tokens_per_block % self.tokens_per_entry:
            raise ValueError(
                f"LayerGroup {self.kind!r}: one entry covers {self.tokens_per_entry} "
                f"tokens, which does not divide the block of {tokens_per_block} tokens")
        whole = self.entry_bytes * (tokens_per_block // self.tokens_per_entry)
        return min(whole, self.window_bytes) if self.window_bytes else whole

    def coarsened(self, engine_block_tokens: int, tokens_per_block: int) -> LayerGroup:
        """This group seen at ``tokens_per_block``-token blocks over an engine whose
        pages are ``engine_block_tokens``: a windowed group holds the engine's pages of
        its window as of a block's end (``window_bytes``), however many more tokens
        the block spans; any other group, or a block no coarser, is unchanged."""
        if not self.window_tokens or tokens_per_block <= engine_block_tokens:
            return self
        pages = -(-self.window_tokens // engine_block_tokens)
        held = pages * dataclasses.replace(self, window_bytes=0).block_bytes(
            engine_block_tokens)
        if held >= self.entry_bytes * (tokens_per_block // self.tokens_per_entry):
            return self
        return dataclasses.replace(self, window_bytes=held)

    def window_blocks(self, tokens_per_block: int) -> int:
        """Blocks a next turn reads of this group (0: all of them)."""
        return -(-self.window_tokens // tokens_per_block) if self.window_tokens else 0


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """Sizes of one model's paged KV cache, per worker.

    Attributes:
        num_layers: attention layers whose KV is stored.
        tokens_per_block: tokens in one paged block (the engine's block size).
        num_kv_heads: KV heads held by one worker (after tensor-parallel split);
            0 for MLA models.
        head_dim: size of one head.
        dtype: element type name, a key of ``DTYPE_BYTES``.
        mla_latent_dim: for MLA models, elements per token per layer
            (kv_lora_rank + rope dim); 0 for standard attention (K and V stored).
        name: preset name or "custom".
        groups: layers of different kinds, in layer order (their layer counts sum to
            ``num_layers``); empty when every layer is the one the fields above size.
    """

    num_layers: int
    tokens_per_block: int
    num_kv_heads: int = 0
    head_dim: int = 0
    dtype: str = "bfloat16"
    mla_latent_dim: int = 0
    name: str = "custom"
    groups: tuple[LayerGroup, ...] = ()
    _layer_sizes: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _layer_windows: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._validate()
        if self.groups:
            sizes = tuple(size for grp in self.groups for size in
                          (grp.block_bytes(self.tokens_per_block),) * grp.num_layers)
            windows = tuple(w for grp in self.groups for w in
                            (grp.window_blocks(self.tokens_per_block),) * grp.num_layers)
        else:
            sizes = (self.block_bytes_per_layer,) * self.num_layers
            windows = ()
        object.__setattr__(self, "_layer_sizes", sizes)
        object.__setattr__(self, "_layer_windows", windows if any(windows) else ())

    def _validate(self) -> None:
        for field_name in ("num_layers", "tokens_per_block", "num_kv_heads", "head_dim",
                           "mla_latent_dim"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"KVGeometry.{field_name} must be an int, got {value!r}")
        for field_name in ("num_layers", "tokens_per_block"):
            value = getattr(self, field_name)
            if value <= 0:
                raise ValueError(f"KVGeometry.{field_name} must be a positive int, got {value!r}")
        if not isinstance(self.name, str):
            raise ValueError(f"KVGeometry.name must be a str, got {self.name!r}")
        if not isinstance(self.dtype, str) or self.dtype not in DTYPE_BYTES:
            raise ValueError(
                f"KVGeometry.dtype {self.dtype!r} is not supported; choose one of "
                f"{sorted(DTYPE_BYTES)}"
            )
        if self.groups:
            self._check_groups()
            return
        if self.mla_latent_dim < 0:
            raise ValueError(f"KVGeometry.mla_latent_dim must be >= 0, got {self.mla_latent_dim}")
        if self.mla_latent_dim == 0:
            if self.num_kv_heads <= 0:
                raise ValueError(
                    f"KVGeometry.num_kv_heads must be > 0 without MLA, got {self.num_kv_heads!r}"
                )
            if self.head_dim <= 0:
                raise ValueError(
                    f"KVGeometry.head_dim must be > 0 without MLA, got {self.head_dim!r}"
                )

    def _check_groups(self) -> None:
        if not all(isinstance(grp, LayerGroup) for grp in self.groups):
            raise ValueError(f"KVGeometry.groups must hold LayerGroup values, got "
                             f"{self.groups!r}")
        total = sum(grp.num_layers for grp in self.groups)
        if total != self.num_layers:
            raise ValueError(f"KVGeometry.groups hold {total} layers, num_layers is "
                             f"{self.num_layers}")
        for grp in self.groups:
            grp.block_bytes(self.tokens_per_block)

    @property
    def layer_block_bytes(self) -> tuple[int, ...]:
        """Bytes of one block of each layer, in layer order."""
        return self._layer_sizes

    @property
    def layer_window_blocks(self) -> tuple[int, ...]:
        """Each layer's sliding window in blocks (0: every block is kept), in layer
        order; empty when no layer has a window. A segment stores only the last
        ``window`` blocks of such a layer (``layout.SegmentLayout``)."""
        return self._layer_windows

    @property
    def layer_groups(self) -> tuple[LayerGroup, ...]:
        """The groups, or one group of every layer for a model whose layers are alike."""
        if self.groups:
            return self.groups
        return (LayerGroup(self.num_layers, self.bytes_per_token_per_layer),)

    def kind_bytes(self, layer_bytes: Sequence[int]) -> dict[str, int]:
        """Per-layer byte counts summed per group kind (``LayerGroup.kind``), in group
        order: e.g. what a store holds of each kind against what all its blocks take."""
        out: dict[str, int] = {}
        at = 0
        for grp in self.layer_groups:
            out[grp.kind] = out.get(grp.kind, 0) + sum(layer_bytes[at:at + grp.num_layers])
            at += grp.num_layers
        return out

    def whole_entry_tokens(self, tokens: int) -> int:
        """The smallest multiple of ``tokens`` that holds whole entries of every group
        (a block size this geometry accepts)."""
        return math.lcm(tokens, *(grp.tokens_per_entry for grp in self.layer_groups))

    @property
    def history_block_bytes(self) -> int:
        """Bytes of one block in the layers that keep every block: a windowed layer
        keeps its window only, however long the history grows."""
        windows = self.layer_window_blocks or (0,) * self.num_layers
        return sum(b for b, w in zip(self.layer_block_bytes, windows, strict=True) if not w)

    def restore_bytes(self, num_blocks: int) -> int:
        """Bytes a restore of a request's ``num_blocks`` blocks hands the engine: every
        block of the layers that keep their history, the last ``window`` blocks of a
        windowed layer (the rows the next token attends to)."""
        windows = self.layer_window_blocks or (0,) * self.num_layers
        return sum(size * (min(w, num_blocks) if w else num_blocks)
                   for size, w in zip(self.layer_block_bytes, windows, strict=True))

    @property
    def is_uniform(self) -> bool:
        """Every layer's block has the same size."""
        return len(set(self.layer_block_bytes)) == 1

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def is_mla(self) -> bool:
        return self.mla_latent_dim > 0

    @property
    def bytes_per_token_per_layer(self) -> int:
        if self.groups:
            raise ValueError(f"geometry {self.name!r} has layers of different kinds; "
                             f"use layer_block_bytes")
        if self.is_mla:
            return self.mla_latent_dim * self.dtype_bytes
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def bytes_per_token(self) -> int:
        """All layers' bytes per token (a compressed layer's share of its entries)."""
        return self.block_bytes // self.tokens_per_block

    @property
    def block_bytes_per_layer(self) -> int:
        return self.bytes_per_token_per_layer * self.tokens_per_block

    @property
    def block_bytes(self) -> int:
        """All layers of one block."""
        return sum(self.layer_block_bytes)

    def kv_bytes(self, num_tokens: int) -> int:
        """KV bytes of ``num_tokens`` tokens, all layers."""
        return num_tokens * self.block_bytes // self.tokens_per_block

    def to_record(self) -> dict[str, Any]:
        """The fields as plain JSON values (``from_record`` reads them back)."""
        return {f.name: getattr(self, f.name) if f.name != "groups" else
                [dataclasses.asdict(grp) for grp in self.groups]
                for f in dataclasses.fields(self) if f.init}

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> KVGeometry:
        """A geometry from ``to_record``'s values (a record without groups: one kind)."""
        fields = dict(data)
        groups = tuple(LayerGroup(**grp) for grp in fields.pop("groups", ()))
        return cls(**fields, groups=groups)

    def with_block_size(self, tokens_per_block: int) -> KVGeometry:
        """This model at ``tokens_per_block``-token blocks (a trace's block). A block
        coarser than this geometry's own (the engine's page) charges a windowed group
        the engine's pages of its window, not every token of the block
        (``LayerGroup.coarsened``): DeepSeek-V4's 128-token compressor state is one
        128-token page per 512-token trace block, not four."""
        groups = tuple(grp.coarsened(self.tokens_per_block, tokens_per_block)
                       for grp in self.groups)
        return KVGeometry(
            num_layers=self.num_layers,
            tokens_per_block=tokens_per_block,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            dtype=self.dtype,
            mla_latent_dim=self.mla_latent_dim,
            name=self.name,
            groups=groups,
        )


# Sources:
# - Llama-3.1-8B / 70B: meta-llama config.json (num_hidden_layers 32 / 80,
#   num_key_value_heads 8, head_dim 128), bf16. Whole model on one worker.
# - DeepSeek-V3: deepseek-ai/DeepSeek-V3 config.json (num_hidden_layers 61,
#   kv_lora_rank 512, qk_rope_head_dim 64): MLA caches 512 + 64 = 576 elements per
#   token per layer, replicated on every worker.
# - DeepSeek-V4-Flash: deepseek-ai/DeepSeek-V4-Flash config.json (43 layers,
#   ``compress_ratios`` 0, 0, then 4 and 128 in turn: 21 compressed-4x "c4a" and 20
#   compressed-128x "c128a" layers; ``head_dim`` 512, ``sliding_window`` 128, indexer
#   ``index_head_dim`` 128), with vLLM 0.32's fp8_ds_mla cache. Each of vLLM's per-layer
#   caches is one group, its bytes vLLM's own page size over the tokens a page covers
#   (pages padded to 576 B; tests/connectors/test_dsv4_preset.py checks them against
#   the specs vLLM builds):
#   * every layer keeps a 128-token window of raw entries (models/deepseek_v4/
#     attention.py ``DeepseekV4SWACache``; v1/attention/backends/mla/sparse_swa.py):
#     37,440 B per 64 tokens, 585 B a token;
#   * c4a layers an MLA entry per 4 tokens (37,440 B per 256 tokens, 585 B) and an
#     indexer key per 4 tokens (``DeepseekV4IndexerCache``: 8,640 B per 256 tokens,
#     135 B); c128a layers an MLA entry per 128 tokens (1,728 B per 256 tokens, 864 B);
#   * compressor state, tokens still being compressed (models/deepseek_v4/compressor.py
#     ``CompressorStateCache``, float32): c4a 32,832 B per 4 tokens (8,208 B a token)
#     and its indexer's 8,640 B per 4 tokens (2,160 B), an 8-token window; c128a 32,832
#     B per 8 tokens (4,104 B a token), a 128-token window. vLLM prefix-caches these
#     with bounded replay on and off; the 43 windows only with it off. A window group's
#     block holds the window as of the block's end: c4a's 8-token state is one
#     8 x 8,208 B entry per 128-token block.
#   One block is 128 tokens so every kind holds whole entries.
# - Qwen3.5-35B-A3B: transformers' Qwen3_5MoeTextConfig, whose defaults are that
#   checkpoint's (models/qwen3_5_moe/configuration_qwen3_5_moe.py lines 89-129 in the
#   engine venv: 40 layers, every fourth full attention, the rest Gated DeltaNet
#   "linear_attention"; 2 KV heads of 256 dims; linear 16 key heads and 32 value heads
#   of 128 dims, conv kernel 4), bf16, as vLLM 0.32 caches it with prefix caching:
#   * full attention: K and V of 2 x 256 bf16 = 2,048 B per token per layer;
#   * each of 30 GDN layers one state (model_executor/layers/mamba/mamba_utils.py
#     ``gated_delta_net_state_shape`` lines 280-301, ``_mamba_state_dtype`` 98-110;
#     models/qwen3_5.py ``get_mamba_state_*_from_config`` 388-419): a conv state of
#     (4 - 1) x (128 x 16 x 2 + 128 x 32) = 3 x 8,192 bf16 (49,152 B) and an SSM state
#     of 32 x 128 x 128 bf16 (1,048,576 B; mamba_ssm_cache_dtype "auto" keeps the model
#     dtype): 1,097,728 B;
#   * ``mamba_cache_mode = "align"`` (models/config.py line 687) checkpoints the state
#     every Mamba block, which platforms/interface.py ``_align_hybrid_block_size``
#     (lines 1086-1103) makes the attention block: the smallest multiple of the
#     kernel's 16 tokens (FlashAttention on Hopper, v1/attention/backends/flash_attn.py
#     line 365) whose attention page holds a state, 34 x 16 = 544 tokens (vLLM pads the
#     state's page by 1.5 % to 1,114,112 B; FlatCake stores the state's own bytes).
_DSV4_ENTRY = 585
_QWEN35_BLOCK = 544
PRESETS: dict[str, KVGeometry] = {
    "llama-3.1-8b": KVGeometry(
        num_layers=32, tokens_per_block=16, num_kv_heads=8, head_dim=128,
        dtype="bfloat16", name="llama-3.1-8b",
    ),
    "llama-3.1-70b": KVGeometry(
        num_layers=80, tokens_per_block=16, num_kv_heads=8, head_dim=128,
        dtype="bfloat16", name="llama-3.1-70b",
    ),
    "deepseek-v3": KVGeometry(
        num_layers=61, tokens_per_block=64, mla_latent_dim=576,
        dtype="bfloat16", name="deepseek-v3",
    ),
    "deepseek-v4-flash": KVGeometry(
        num_layers=167, tokens_per_block=128, dtype="uint8", name="deepseek-v4-flash",
        groups=(LayerGroup(43, _DSV4_ENTRY, window_tokens=128, kind="sliding"),
                LayerGroup(21, _DSV4_ENTRY, tokens_per_entry=4, kind="c4a"),
                LayerGroup(21, 135, tokens_per_entry=4, kind="c4a-indexer"),
                LayerGroup(20, 864, tokens_per_entry=128, kind="c128a"),
                LayerGroup(21, 8 * 8208, tokens_per_entry=128, window_tokens=8,
                           kind="c4a-state"),
                LayerGroup(21, 8 * 2160, tokens_per_entry=128, window_tokens=8,
                           kind="c4a-indexer-state"),
                LayerGroup(20, 4104, window_tokens=128, kind="c128a-state")),
    ),
    "qwen3.5-35b-a3b": KVGeometry(
        num_layers=40, tokens_per_block=_QWEN35_BLOCK, num_kv_heads=2, head_dim=256,
        dtype="bfloat16", name="qwen3.5-35b-a3b",
        groups=(LayerGroup(10, 2 * 2 * 256 * 2, kind="full"),
                LayerGroup.state(30, ((3, 8192), (32, 128, 128)),
                                 ("bfloat16", "bfloat16"), _QWEN35_BLOCK, kind="gdn")),
    ),
}


def preset(name: str) -> KVGeometry:
    """Look up a geometry preset by name (case-insensitive)."""
    key = name.lower()
    if key not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[key]
