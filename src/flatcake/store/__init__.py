"""The FlatCake store: the public API over the control plane and the data plane.

Exports resolve on first use (PEP 562), so ``import flatcake.store.inspect`` (the
read-only tools behind ``flatcake inspect`` / ``fsck``) does not load the data plane and
torch; ``from flatcake.store import FlatCakeStore`` works as always.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flatcake.store.inspect import FileCheck, FsckReport, fsck_root, inspect_root
    from flatcake.store.restores import LoadHandle
    from flatcake.store.results import (
        LoadResult,
        LookupResult,
        ReclaimResult,
        RecoveryReport,
        StoreResult,
        TurnSignals,
    )
    from flatcake.store.store import FlatCakeStore

_WHERE = {
    "FileCheck": "inspect", "FsckReport": "inspect", "fsck_root": "inspect",
    "inspect_root": "inspect", "LoadResult": "results", "LookupResult": "results",
    "ReclaimResult": "results", "RecoveryReport": "results", "StoreResult": "results",
    "TurnSignals": "results", "FlatCakeStore": "store", "LoadHandle": "restores",
}

__all__ = [
    "FileCheck",
    "FlatCakeStore",
    "FsckReport",
    "LoadHandle",
    "LoadResult",
    "LookupResult",
    "ReclaimResult",
    "RecoveryReport",
    "StoreResult",
    "TurnSignals",
    "fsck_root",
    "inspect_root",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'flatcake.store' has no attribute {name!r}")
    return getattr(importlib.import_module(f"flatcake.store.{_WHERE[name]}"), name)
