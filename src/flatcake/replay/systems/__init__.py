"""The systems a replay compares: FlatCake (the real control plane) and its baselines,
all named in one table (``registry``)."""

from __future__ import annotations

from flatcake.replay.systems.registry import (
    ALL_SYSTEMS,
    BUILTIN_SYSTEMS,
    REGISTRY,
    SHARING_SYSTEMS,
    STYLES,
    SYSTEMS,
    Entry,
    Style,
    make_system,
)

__all__ = ["ALL_SYSTEMS", "BUILTIN_SYSTEMS", "REGISTRY", "SHARING_SYSTEMS", "STYLES",
           "SYSTEMS", "Entry", "Style", "make_system"]
