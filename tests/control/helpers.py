"""Builders shared by the control-plane tests: segments for the books on their own, and
a small ``ControlPlane`` on a manual clock with deterministic session keys and the two
turns most scenarios start with."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from flatcake.clock import ManualClock
from flatcake.config import FlatCakeConfig, PlacementConfig, ReclaimConfig, StoreConfig
from flatcake.control import ControlPlane, StorePlan
from flatcake.control.address import Medium, encode_address
from flatcake.control.index import Segment
from flatcake.geometry import KVGeometry
from flatcake.layout import SegmentLayout
from flatcake.plan.reads import plan_reads


def key(i: int) -> bytes:
    """A distinct 32-byte key per int."""
    return i.to_bytes(32, "big")


def keys(start: int, stop: int) -> list[bytes]:
    return [key(i) for i in range(start, stop)]


def ssd_segment(segment_id: int, ks: Sequence[bytes], *, num_layers: int = 2,
                block_bytes: int = 64, file_id: int = 0, file_offset: int = 4096,
                base_offset: int = 0, session_id: str = "s", turn: int = 0) -> Segment:
    layout = SegmentLayout.for_ssd(len(ks), (block_bytes,) * num_layers)
    return Segment(segment_id, session_id, Medium.SSD,
                   encode_address(Medium.SSD, 0, base_offset + file_offset), layout,
                   tuple(ks), turn, file_id, file_offset)


def memory_segment(segment_id: int, ks: Sequence[bytes], *, num_layers: int = 2,
                   block_bytes: int = 64, arena_offset: int = 0, session_id: str = "s",
                   turn: int = 0) -> Segment:
    layout = SegmentLayout.for_memory(len(ks), (block_bytes,) * num_layers)
    return Segment(segment_id, session_id, Medium.MEMORY,
                   encode_address(Medium.MEMORY, 0, arena_offset), layout, tuple(ks), turn)


K = 4096
# 2 layers x 4 tokens x (K+V x 1 head x 8 dims x 2 bytes) = 128 bytes per block per layer.
GEOM = KVGeometry(num_layers=2, tokens_per_block=4, num_kv_heads=1, head_dim=8,
                  dtype="float16")


def make(memory_pages: int = 64, ssd_pages: int = 1024, span_pages: int = 64,
         high: float = 0.9, low: float = 0.5, copy_watermark: float = 0.0,
         not_yet: bool = False, shared_refcount_threshold: int = 2,
         write_back: bool = False, idle_s: float = 0.0
         ) -> tuple[ControlPlane, ManualClock]:
    """A control plane with budgets in 4 KiB pages and reclaim watermarks ``high``/``low``
    (``not_yet``, ``shared_refcount_threshold``: those ``placement`` keys;
    ``write_back``, ``idle_s``: ``not_yet_write_back``, ``not_yet_idle_s``, on a host
    that writes not-yet homes back)."""
    cfg = FlatCakeConfig(
        # The short-reply and shared-prefix rules on (512 tokens and any sharing, their
        # values before memory copies) so that these scenarios have memory-homed turns.
        placement=PlacementConfig(short_reply_threshold_tokens=512,
                                  shared_refcount_threshold=shared_refcount_threshold,
                                  memory_copy_watermark=copy_watermark, not_yet=not_yet,
                                  not_yet_write_back=write_back, not_yet_idle_s=idle_s),
        store=StoreConfig(memory_capacity_bytes=memory_pages * K,
                          ssd_capacity_bytes=ssd_pages * K,
                          session_file_bytes=span_pages * K),
        reclaim=ReclaimConfig(ssd_high=high, ssd_low=low, memory_high=high, memory_low=low),
    )
    clock = ManualClock()
    return ControlPlane(GEOM, cfg, clock, planner=plan_reads, write_backs=write_back), clock


def skeys(session: str, n: int) -> list[bytes]:
    """``n`` distinct 32-byte block keys of ``session``."""
    return [hashlib.sha256(f"{session}:{i}".encode()).digest() for i in range(n)]


def first_turn(cp: ControlPlane, session: str, n: int) -> StorePlan:
    """Store and complete turn 0 of ``session``: ``n`` blocks (on SSD by the first-turn rule)."""
    plan = cp.prepare_store(session, skeys(session, n), turn_index=0, context_tokens=4 * n)
    assert plan is not None
    cp.complete_store(plan, True)
    return plan


def chat_turn(cp: ControlPlane, session: str, n: int, turn: int = 1) -> StorePlan:
    """Store and complete a turn after a short reply (host memory unless it is full)."""
    plan = cp.prepare_store(session, skeys(session, n), turn_index=turn, context_tokens=4 * n,
                            prev_reply_tokens=50)
    assert plan is not None
    cp.complete_store(plan, True)
    return plan
