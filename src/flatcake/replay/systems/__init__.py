"""The systems a replay compares: FlatCake (the real control plane) and its baselines."""

from __future__ import annotations

import dataclasses

from flatcake.config import FlatCakeConfig
from flatcake.replay.engine import System
from flatcake.replay.systems.flatcake import FlatCakeSystem
from flatcake.replay.systems.memory_only import MemoryOnlySystem
from flatcake.replay.systems.tiered import TieredConfig, TieredSystem

SYSTEMS: tuple[str, ...] = ("flatcake", "flatcake-1q", "tiered", "tiered-direct",
                            "memory-only")
"""System names accepted by ``flatcake replay --system`` and ``sweep --systems``."""


def make_system(name: str, fc_config: FlatCakeConfig, tiered: TieredConfig) -> System:
    """A fresh system object for one run."""
    if name == "flatcake":
        cfg = dataclasses.replace(
            fc_config, scheduler=dataclasses.replace(fc_config.scheduler, single_queue=False))
        return FlatCakeSystem(cfg, name)
    if name == "flatcake-1q":
        cfg = dataclasses.replace(
            fc_config, scheduler=dataclasses.replace(fc_config.scheduler, single_queue=True))
        return FlatCakeSystem(cfg, name)
    if name == "tiered":
        return TieredSystem(dataclasses.replace(tiered, direct=False), name)
    if name == "tiered-direct":
        return TieredSystem(dataclasses.replace(tiered, direct=True), name)
    if name == "memory-only":
        return MemoryOnlySystem()
    raise ValueError(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)}")


__all__ = ["SYSTEMS", "FlatCakeSystem", "MemoryOnlySystem", "TieredConfig", "TieredSystem",
           "make_system"]
