"""FlatCake: a flat KV-cache store for LLM serving.

The public names below resolve on first use (PEP 562): importing a submodule (the
command line, a trace reader) does not load the control plane, and ``flatcake --help``
starts in a tenth of a second. ``from flatcake import ControlPlane`` works as always.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flatcake.clock import Clock, ManualClock, WallClock
    from flatcake.config import FlatCakeConfig, load_config
    from flatcake.control import ControlPlane, LoadPlan, ReclaimAction, StorePlan
    from flatcake.control.address import Address, Medium, decode_address, encode_address
    from flatcake.control.keys import as_block_key, chain_block_keys
    from flatcake.errors import CapacityError, IntegrityError
    from flatcake.geometry import PRESETS, KVGeometry, preset

_WHERE = {
    "Clock": "clock", "ManualClock": "clock", "WallClock": "clock",
    "FlatCakeConfig": "config", "load_config": "config",
    "ControlPlane": "control.plane", "LoadPlan": "control.types", "ReclaimAction": "control.types",
    "StorePlan": "control.types", "CapacityError": "errors", "IntegrityError": "errors",
    "PRESETS": "geometry", "KVGeometry": "geometry", "preset": "geometry",
    "Address": "control.address", "Medium": "control.address", "decode_address": "control.address",
    "encode_address": "control.address", "as_block_key": "control.keys",
    "chain_block_keys": "control.keys",
}

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


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'flatcake' has no attribute {name!r}")
    return getattr(importlib.import_module(f"flatcake.{_WHERE[name]}"), name)
