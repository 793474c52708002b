"""The systems a replay compares: FlatCake (the real control plane) and its baselines."""

from __future__ import annotations

import dataclasses
from typing import Any

from flatcake.config import FlatCakeConfig
from flatcake.replay.node.node import System
from flatcake.replay.systems.flatcake import FlatCakeSystem
from flatcake.replay.systems.hicache import HiCacheSystem
from flatcake.replay.systems.memory import MemoryOnlySystem
from flatcake.replay.systems.sharing import SharedFlatCake, SharedTieredDirect
from flatcake.replay.systems.tiered import TieredConfig, TieredSystem

SYSTEMS: tuple[str, ...] = ("flatcake", "flatcake-1q", "tiered", "tiered-wait",
                            "tiered-direct", "memory-only")
"""The systems a sweep compares by default."""

ALL_SYSTEMS: tuple[str, ...] = (*SYSTEMS, "tiered-timeout", "tiered-uring")
"""Every system name ``flatcake replay --system`` and ``sweep --systems`` accept.

``tiered`` is SGLang HiCache's default ``best_effort`` prefetch policy; ``tiered-wait``
its ``wait_complete`` (every SSD hit used, the request waits for it); ``tiered-timeout``
its ``timeout`` policy; ``tiered-uring`` is ``tiered`` with Mooncake's io_uring read path
(``MOONCAKE_OFFLOAD_USE_URING``: the drive's queue depth instead of one ``pread`` at a
time)."""

_HICACHE: dict[str, dict[str, Any]] = {
    "tiered": {}, "tiered-wait": {"prefetch_policy": "wait_complete"},
    "tiered-timeout": {"prefetch_policy": "timeout"}, "tiered-uring": {"read_queue_depth": 0}}


def make_system(name: str, fc_config: FlatCakeConfig, tiered: TieredConfig,
                shared: bool = False) -> System:
    """A fresh system object for one run. ``shared``: the class that reads other nodes'
    blocks in a cluster replay (``systems.shared``), for the systems that have one."""
    fc_class = SharedFlatCake if shared else FlatCakeSystem
    if name == "flatcake":
        cfg = dataclasses.replace(
            fc_config, scheduler=dataclasses.replace(fc_config.scheduler, single_queue=False))
        return fc_class(cfg, name)
    if name == "flatcake-1q":
        cfg = dataclasses.replace(
            fc_config, scheduler=dataclasses.replace(fc_config.scheduler, single_queue=True))
        return fc_class(cfg, name)
    if name in _HICACHE:
        return HiCacheSystem(dataclasses.replace(tiered, **_HICACHE[name]), name)
    if name == "tiered-direct":
        td_class = SharedTieredDirect if shared else TieredSystem
        return td_class(dataclasses.replace(tiered, direct=True), name)
    if name == "memory-only":
        return MemoryOnlySystem()
    raise ValueError(f"unknown system {name!r}; choose from {', '.join(ALL_SYSTEMS)}")


__all__ = ["ALL_SYSTEMS", "SYSTEMS", "FlatCakeSystem", "HiCacheSystem", "MemoryOnlySystem",
           "TieredConfig", "TieredSystem", "make_system"]
