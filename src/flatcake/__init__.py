"""FlatCake: a flat KV-cache store for LLM serving."""

from flatcake.clock import Clock, ManualClock, WallClock
from flatcake.config import FlatCakeConfig, load_config
from flatcake.control import ControlPlane, LoadPlan, ReclaimAction, StorePlan
from flatcake.errors import CapacityError, IntegrityError
from flatcake.geometry import PRESETS, KVGeometry, preset
from flatcake.gva.address import Address, Medium, decode_address, encode_address
from flatcake.gva.keys import as_block_key, chain_block_keys

__all__ = [
    "PRESETS",
    "Address",
    "CapacityError",
    "Clock",
    "ControlPlane",
    "FlatCakeConfig",
    "IntegrityError",
    "KVGeometry",
    "LoadPlan",
    "ManualClock",
    "Medium",
    "ReclaimAction",
    "StorePlan",
    "WallClock",
    "as_block_key",
    "chain_block_keys",
    "decode_address",
    "encode_address",
    "load_config",
    "preset",
]
__version__ = "0.1.0"
