"""KV-cache geometry: how many bytes one block of one layer takes.

FlatCake treats a block's KV as opaque bytes; geometry only fixes sizes. A block
of layer ``l`` holds ``tokens_per_block`` tokens of that layer's K and V (or, for
MLA models, of the compressed latent), so

    block_bytes_per_layer = tokens_per_block * bytes_per_token_per_layer

Presets name the public model config they come from.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "uint8": 1,
    "int8": 1,
}


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
    """

    num_layers: int
    tokens_per_block: int
    num_kv_heads: int = 0
    head_dim: int = 0
    dtype: str = "bfloat16"
    mla_latent_dim: int = 0
    name: str = "custom"

    def __post_init__(self) -> None:
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

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def is_mla(self) -> bool:
        return self.mla_latent_dim > 0

    @property
    def bytes_per_token_per_layer(self) -> int:
        if self.is_mla:
            return self.mla_latent_dim * self.dtype_bytes
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def bytes_per_token(self) -> int:
        return self.bytes_per_token_per_layer * self.num_layers

    @property
    def block_bytes_per_layer(self) -> int:
        return self.bytes_per_token_per_layer * self.tokens_per_block

    @property
    def block_bytes(self) -> int:
        """All layers of one block."""
        return self.block_bytes_per_layer * self.num_layers

    def kv_bytes(self, num_tokens: int) -> int:
        """KV bytes of ``num_tokens`` tokens, all layers."""
        return num_tokens * self.bytes_per_token

    def with_block_size(self, tokens_per_block: int) -> KVGeometry:
        return KVGeometry(
            num_layers=self.num_layers,
            tokens_per_block=tokens_per_block,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            dtype=self.dtype,
            mla_latent_dim=self.mla_latent_dim,
            name=self.name,
        )


# Sources:
# - Llama-3.1-8B / 70B: meta-llama config.json (num_hidden_layers 32 / 80,
#   num_key_value_heads 8, head_dim 128), bf16. Whole model on one worker.
# - DeepSeek-V3: deepseek-ai/DeepSeek-V3 config.json (num_hidden_layers 61,
#   kv_lora_rank 512, qk_rope_head_dim 64): MLA caches 512 + 64 = 576 elements per
#   token per layer, replicated on every worker.
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
}


def preset(name: str) -> KVGeometry:
    """Look up a geometry preset by name (case-insensitive)."""
    key = name.lower()
    if key not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[key]
