"""The FlatCake store: the public API over the control plane and the data plane."""

from flatcake.store.inspect import FileCheck, FsckReport, fsck_root, inspect_root
from flatcake.store.results import (
    LoadResult,
    LookupResult,
    ReclaimResult,
    RecoveryReport,
    StoreResult,
    TurnSignals,
)
from flatcake.store.store import FlatCakeStore, LoadHandle

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
