"""FlatCake: a flat KV-cache store for LLM serving."""

from flatcake.config import FlatCakeConfig, load_config
from flatcake.geometry import PRESETS, KVGeometry, preset
from flatcake.gva.address import Address, Medium, decode_address, encode_address

__all__ = [
    "PRESETS",
    "Address",
    "FlatCakeConfig",
    "KVGeometry",
    "Medium",
    "decode_address",
    "encode_address",
    "load_config",
    "preset",
]
__version__ = "0.1.0"
