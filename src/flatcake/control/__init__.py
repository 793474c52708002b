"""The books: FlatCake's control plane, pure (no torch, no file I/O).

Keys and 64-bit addresses, the block index, write-time placement, allocation (host
arena in ``alloc``, SSD space in ``ssd_space``), reclaim, memory copies, sessions,
placement signals (``signals``), FC-MAS restore scheduling, and the ``ControlPlane``
facade with its paired lifecycle verbs (``plane``), composed of objects that own their
state: the query methods in ``books``, the store and load verbs in ``stores`` and
``loads``, memory copies in ``spare`` and ``copies``, reclaim and cuts in ``reclaimer``,
damage in ``damage``, restart in ``restart`` (its value types in ``recovery``), the
cross-check in ``integrity``, the plans and actions it returns in ``types``. Every host
(the store, the vLLM connector, the replay) keeps its books with these classes.

The bottom floor above the leaves: the books import only themselves and the leaves
(``geometry``, ``layout``, ``readplan``, ``config``, ``clock``, ``errors``), never the plans
that stand on them; the read planner is given to ``ControlPlane(..., planner=...)``.
"""

from __future__ import annotations

from flatcake.control.address import Address, Medium, decode_address, encode_address
from flatcake.control.alloc import HostArena
from flatcake.control.copies import ArenaCopy, MemoryCopies
from flatcake.control.index import EMPTY_HIT, BlockIndex, BlockLocation, HitRun, PrefixHit, Segment
from flatcake.control.keys import (
    BlockKey,
    as_block_key,
    chain_block_keys,
    engine_block_key,
    namespace_key,
)
from flatcake.control.loads import STALE_HIT
from flatcake.control.placement import (
    Placement,
    PlacementRule,
    PlacementSignals,
    decide_placement,
    explain,
)
from flatcake.control.plane import ControlPlane
from flatcake.control.reclaim import SessionUsage, choose_victims
from flatcake.control.recovery import FileFate, FileVerdict, Recovery, ScannedFile
from flatcake.control.scheduler import (
    PRIORITY_UNIT_BYTES,
    MasScheduler,
    ReadyQueue,
    RestoreRequest,
    SchedulerStats,
    priority,
)
from flatcake.control.sessions import SessionRecord
from flatcake.control.signals import HitOwner, PrefixRefcount, SessionTracker, TurnInfo, hit_owner
from flatcake.control.ssd_space import SessionFile, SsdExtent, SsdSpace
from flatcake.control.types import ControlStats, FileCut, LoadPlan, ReclaimAction, StorePlan

__all__ = [
    "EMPTY_HIT",
    "PRIORITY_UNIT_BYTES",
    "STALE_HIT",
    "Address",
    "ArenaCopy",
    "BlockIndex",
    "BlockKey",
    "BlockLocation",
    "ControlPlane",
    "ControlStats",
    "FileCut",
    "FileFate",
    "FileVerdict",
    "HitOwner",
    "HitRun",
    "HostArena",
    "LoadPlan",
    "MasScheduler",
    "Medium",
    "MemoryCopies",
    "Placement",
    "PlacementRule",
    "PlacementSignals",
    "PrefixHit",
    "PrefixRefcount",
    "ReadyQueue",
    "ReclaimAction",
    "Recovery",
    "RestoreRequest",
    "ScannedFile",
    "SchedulerStats",
    "Segment",
    "SessionFile",
    "SessionRecord",
    "SessionTracker",
    "SessionUsage",
    "SsdExtent",
    "SsdSpace",
    "StorePlan",
    "TurnInfo",
    "as_block_key",
    "chain_block_keys",
    "choose_victims",
    "decide_placement",
    "decode_address",
    "encode_address",
    "engine_block_key",
    "explain",
    "hit_owner",
    "namespace_key",
    "priority",
]
