"""The books: FlatCake's control plane, pure (no torch, no file I/O).

Keys and 64-bit addresses, the block index, write-time placement, allocation (host
arena in ``alloc``, SSD space in ``ssd_space``), reclaim, memory copies, sessions,
placement signals (``signals``), FC-MAS restore scheduling, and the ``ControlPlane``
facade with its paired lifecycle verbs (``plane``; its state and query methods in
``books``, reclaim and cuts in ``reclaimer``, restart in ``restart``, the cross-check in
``integrity``, the plans and actions it returns in ``types``). Every host (the store,
the vLLM connector, the replay) keeps its books with these classes. Names resolve on
first use (PEP 562), so ``flatcake.plan`` can import from here without an import cycle.
"""

from __future__ import annotations

from flatcake.lazy import lazy_getattr

_WHERE = {
    "ControlPlane": "plane",
    "ControlStats": "types",
    "FileCut": "types",
    "LoadPlan": "types",
    "ReclaimAction": "types",
    "StorePlan": "types",
    "Address": "address",
    "Medium": "address",
    "decode_address": "address",
    "encode_address": "address",
    "HostArena": "alloc",
    "SessionFile": "ssd_space",
    "SsdExtent": "ssd_space",
    "SsdSpace": "ssd_space",
    "EMPTY_HIT": "index",
    "BlockIndex": "index",
    "BlockLocation": "index",
    "HitRun": "index",
    "PrefixHit": "index",
    "Segment": "index",
    "BlockKey": "keys",
    "as_block_key": "keys",
    "chain_block_keys": "keys",
    "engine_block_key": "keys",
    "namespace_key": "keys",
    "Placement": "placement",
    "PlacementRule": "placement",
    "PlacementSignals": "placement",
    "decide_placement": "placement",
    "explain": "placement",
    "SessionUsage": "reclaim",
    "FileFate": "restart",
    "FileVerdict": "restart",
    "Recovery": "restart",
    "ScannedFile": "restart",
    "choose_victims": "reclaim",
    "SessionRecord": "sessions",
    "HitOwner": "signals",
    "PrefixRefcount": "signals",
    "SessionTracker": "signals",
    "TurnInfo": "signals",
    "hit_owner": "signals",
    "MemoryCopies": "copies",
    "PRIORITY_UNIT_BYTES": "queues",
    "ReadyQueue": "queues",
    "RestoreRequest": "queues",
    "priority": "queues",
    "MasScheduler": "scheduler",
    "SchedulerStats": "scheduler",
}

__all__ = sorted(_WHERE)


__getattr__ = lazy_getattr(__name__, _WHERE)
