"""The stream planner: the read plan the store and the vLLM connector execute.

``plan_reads`` merges a hit's runs into layer-major commands; the data path widens
every SSD run to its whole segment first, because a segment's layer crc covers the
whole layer range: every byte served is checked before it is scattered. The
``StreamCheck`` list says which stream blocks belong to which segment, and where each
stream block goes in the request (``-1``: read for the check only)::

    hit runs ──► widen SSD runs to whole segments ──► plan_reads ──► ReadPlan
                 stream_request[i] = request block of stream block i (or -1)
                 checks = [StreamCheck(segment)...]

Pure: no I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flatcake.config import PlannerConfig
from flatcake.control.address import Medium
from flatcake.control.index import HitRun
from flatcake.plan.reads import plan_reads
from flatcake.readplan import ReadPlan


@dataclass(frozen=True, slots=True)
class StreamCheck:
    """One segment whose layer bytes are verified before they are scattered.

    Attributes:
        stream_start: first stream block of the whole segment (every layer).
        num_blocks: the segment's blocks (all read, so the layer crc can be computed).
        layer_crcs: expected crc32 of each layer's bytes of the segment.
        request_start: first request block the segment serves (the cut on failure).
        tag: what to report when it fails (the store's segment id).
        layer_first: each layer's first block held (a sliding window holds the
            segment's last blocks only: its crc covers those); empty: all from 0.
    """

    stream_start: int
    num_blocks: int
    layer_crcs: tuple[int, ...]
    request_start: int
    tag: int
    layer_first: tuple[int, ...] = ()


class StreamPlanner:
    """``prepare_load``'s planner: widens each SSD run to its whole segment (every byte
    served is checked against its segment's layer crc32, which covers the whole layer
    range) and records where each stream block goes. Called once, under the store lock.
    """

    def __init__(self, crcs: dict[int, tuple[int, ...]]) -> None:
        self._crcs = crcs
        self.stream_request: list[int] = []
        self.checks: list[StreamCheck] = []

    def __call__(self, runs: Sequence[HitRun], num_layers: int, resolve: Any,
                 cfg: PlannerConfig) -> ReadPlan:
        widened: list[HitRun] = []
        request: list[int] = []
        by_segment: dict[int, list[HitRun]] = {}
        for run in runs:
            seg, start_pos, count, prefix_start = run
            if seg.medium == Medium.MEMORY:
                widened.append(HitRun(seg, start_pos, count, len(request)))
                request.extend(range(prefix_start, prefix_start + count))
            else:
                by_segment.setdefault(seg.segment_id, []).append(run)
        for seg_runs in by_segment.values():
            seg = seg_runs[0].segment
            start = len(request)
            part = [-1] * seg.num_blocks
            for _, start_pos, count, prefix_start in seg_runs:
                part[start_pos:start_pos + count] = range(prefix_start, prefix_start + count)
            request.extend(part)
            widened.append(HitRun(seg, 0, seg.num_blocks, start))
            crcs = self._crcs.get(seg.segment_id, ())
            lay = seg.layout
            first = tuple(lay.layer_first(k) for k in range(lay.num_layers)) \
                if lay.is_windowed else ()
            self.checks.append(StreamCheck(start, seg.num_blocks, crcs,
                                           min(r.prefix_start for r in seg_runs),
                                           seg.segment_id, first))
        self.stream_request = request
        return plan_reads(widened, num_layers, resolve, cfg)
