"""Every system a replay can compare, in one table: how to build it (one node, and the
cluster variant that reads other nodes' blocks where it has one), how its series is
drawn, and whether a default sweep runs it. Adding a system is its module plus one
``Entry`` here; the CLI, the sweep, the cluster and the plots read this table."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

from flatcake.config import FlatCakeConfig
from flatcake.replay.node.node import System
from flatcake.replay.systems.flatcake import FlatCakeSystem
from flatcake.replay.systems.hicache import HiCacheSystem
from flatcake.replay.systems.memory import MemoryOnlySystem
from flatcake.replay.systems.settings import TieredConfig
from flatcake.replay.systems.sharing import FlatCakeReads, TieredReads
from flatcake.replay.systems.tiered import TieredSystem


class Style(NamedTuple):
    """How a system's series is drawn (``replay.plots``): distinct colour, marker and
    line style per system, largest markers drawn first."""

    color: str
    marker: str
    linestyle: str | tuple[int, tuple[int, ...]]  # a name or (offset, dash pattern)
    markersize: float
    hollow: bool


Factory = Callable[[str, FlatCakeConfig, TieredConfig, bool], System]
"""(name, FlatCake config, tiered config, shared) -> a fresh system for one run;
``shared`` asks for the cluster variant (only given where ``Entry.shares``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One system.

    Attributes:
        name: what ``--system`` / ``--systems`` take and tables show.
        make: the factory.
        style: its plot style.
        shares: has a cluster variant that reads other nodes' blocks.
        sweep: in ``flatcake sweep``'s default systems on a trace.
        builtin: also in the default on the built-in workloads (the one-queue ablation
            is identical wherever per-worker queues stay empty, so it runs where they
            form: a trace, or the report's ``ablation`` step).
    """

    name: str
    make: Factory
    style: Style
    shares: bool = False
    sweep: bool = False
    builtin: bool = False


def _flatcake(single_queue: bool) -> Factory:
    def make(name: str, fc: FlatCakeConfig, tiered: TieredConfig, shared: bool) -> System:
        cfg = dataclasses.replace(
            fc, scheduler=dataclasses.replace(fc.scheduler, single_queue=single_queue))
        return FlatCakeSystem(cfg, name, FlatCakeReads if shared else None)
    return make


def _hicache(**knobs: Any) -> Factory:
    def make(name: str, fc: FlatCakeConfig, tiered: TieredConfig, shared: bool) -> System:
        return HiCacheSystem(dataclasses.replace(tiered, **knobs), name)
    return make


def _tiered_direct(name: str, fc: FlatCakeConfig, tiered: TieredConfig,
                   shared: bool) -> System:
    # Mooncake read straight into vLLM's paged KV: vLLM's window rule.
    return TieredSystem(dataclasses.replace(tiered, direct=True, window_rule="vllm"), name,
                        TieredReads if shared else None)


def _memory_only(name: str, fc: FlatCakeConfig, tiered: TieredConfig,
                 shared: bool) -> System:
    return MemoryOnlySystem()


REGISTRY: tuple[Entry, ...] = (
    Entry("flatcake", _flatcake(False), Style("tab:blue", "o", "-", 11, True),
          shares=True, sweep=True, builtin=True),
    Entry("flatcake-1q", _flatcake(True), Style("tab:cyan", "x", "--", 7, False),
          shares=True, sweep=True),
    # SGLang HiCache's default ``best_effort`` prefetch policy.
    Entry("tiered", _hicache(), Style("tab:red", "s", "-", 10, True),
          sweep=True, builtin=True),
    # ``wait_complete``: every SSD hit used, the request waits for it.
    Entry("tiered-wait", _hicache(prefetch_policy="wait_complete"),
          Style("tab:purple", "D", (0, (3, 1, 1, 1, 1, 1)), 6, False),
          sweep=True, builtin=True),
    Entry("tiered-direct", _tiered_direct, Style("tab:orange", "P", "-.", 7, False),
          shares=True, sweep=True, builtin=True),
    Entry("memory-only", _memory_only, Style("dimgray", "^", (0, (5, 2, 1, 2)), 8, False),
          sweep=True, builtin=True),
    # HiCache's ``timeout`` prefetch policy.
    Entry("tiered-timeout", _hicache(prefetch_policy="timeout"),
          Style("tab:brown", "v", (0, (6, 2)), 7, False)),
    # ``tiered`` with Mooncake's io_uring read path (``MOONCAKE_OFFLOAD_USE_URING``: the
    # drive's queue depth instead of one ``pread`` at a time).
    Entry("tiered-uring", _hicache(read_queue_depth=0),
          Style("tab:pink", "<", (0, (2, 2)), 7, False)),
)
ENTRIES: dict[str, Entry] = {e.name: e for e in REGISTRY}

ALL_SYSTEMS: tuple[str, ...] = tuple(ENTRIES)
"""Every system name ``flatcake replay --system`` and ``sweep --systems`` accept."""
SYSTEMS: tuple[str, ...] = tuple(e.name for e in REGISTRY if e.sweep)
"""The systems a sweep compares by default on a trace."""
BUILTIN_SYSTEMS: tuple[str, ...] = tuple(e.name for e in REGISTRY if e.builtin)
"""The systems a sweep compares by default on the built-in workloads."""
SHARING_SYSTEMS: tuple[str, ...] = tuple(e.name for e in REGISTRY if e.shares)
"""Systems whose nodes can read each other's blocks in a cluster replay."""
STYLES: dict[str, Style] = {e.name: e.style for e in REGISTRY}


def make_system(name: str, fc_config: FlatCakeConfig, tiered: TieredConfig,
                shared: bool = False) -> System:
    """A fresh system object for one run. ``shared``: the cluster variant that reads
    other nodes' blocks (built with a ``systems.sharing`` collaborator), for the
    systems that have one."""
    entry = ENTRIES.get(name)
    if entry is None:
        raise ValueError(f"unknown system {name!r}; choose from {', '.join(ALL_SYSTEMS)}")
    return entry.make(name, fc_config, tiered, shared and entry.shares)
