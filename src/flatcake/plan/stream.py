"""The stream planner: the read plan the store and the vLLM connector execute.

``plan_reads`` merges a hit's runs into layer-major commands; every byte served is
checked before it is scattered. A segment with block crcs (format version 4,
``SegmentLayout.block_crcs``) is read only over the blocks the hit wants (from its first
to its last wanted block); an older one is widened to the whole segment, because its
layer crc covers the whole layer range. A sliding-window layer reads (and checks) only
the blocks of that span it holds. The ``StreamCheck`` list says which stream
blocks belong to which segment, and where each stream block goes in the request
(``-1``: read for the check only)::

    hit runs ──► SSD runs: span of the wanted blocks (v4) ──► plan_reads ──► ReadPlan
                 or the whole segment (v1 to v3)
                 stream_request[i] = request block of stream block i (or -1)
                 checks = [StreamCheck(segment, first block, blocks)...]

Pure: no I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flatcake.config import PlannerConfig
from flatcake.control.address import Medium
from flatcake.control.index import HitRun
from flatcake.plan.reads import plan_reads
from flatcake.readplan import ReadPlan


@dataclass(frozen=True, slots=True)
class StreamCheck:
    """Blocks of one segment whose layer bytes are verified before they are scattered.

    Attributes:
        stream_start: first stream block of the checked blocks (every layer).
        num_blocks: blocks checked (all read, so their layer crc can be computed).
        layer_crcs: expected crc32 of each layer's bytes of those blocks.
        request_start: first request block the segment serves (the cut on failure).
        tag: what to report when it fails (the store's segment id).
        first: the segment's block the checked blocks start at.
        whole: the checked blocks are the whole segment (its layer crcs check them).
        layer_first: each layer's first block held, in the segment (a sliding window
            holds the segment's last blocks only: its crc covers those of the checked
            blocks); empty: all from 0.
        row_first: each layer's block minus row for the blocks checked
            (``SegmentLayout.row_shift``: the block of its first row as written when
            its rows are one run; the crc table holds rows); empty: as ``layer_first``.
    """

    stream_start: int
    num_blocks: int
    layer_crcs: tuple[int, ...]
    request_start: int
    tag: int
    first: int = 0
    whole: bool = True
    layer_first: tuple[int, ...] = ()
    row_first: tuple[int, ...] = ()

    def layer_skip(self, layer: int) -> int:
        """Leading checked blocks ``layer`` does not hold (all: nothing to check)."""
        held = self.layer_first[layer] if self.layer_first else 0
        return min(self.num_blocks, max(0, held - self.first))


class StreamPlanner:
    """``prepare_load``'s planner: spans each SSD segment's wanted blocks (with block
    crcs) or widens it to the whole segment (without: its layer crc32 covers the whole
    layer range), and records where each stream block goes. Called once, under the
    store lock."""

    def __init__(self, crcs: dict[int, tuple[int, ...]]) -> None:
        self._crcs = crcs
        self.stream_request: list[int] = []
        self.checks: list[StreamCheck] = []

    @property
    def crcs(self) -> dict[int, tuple[int, ...]]:
        """The block crcs it was given, by segment id (read-only)."""
        return dict(self._crcs)

    def __call__(self, runs: Sequence[HitRun], num_layers: int,
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
            lo, hi = 0, seg.num_blocks
            if seg.layout.block_crcs:
                lo = min(r.start_pos for r in seg_runs)
                hi = max(r.start_pos + r.num_blocks for r in seg_runs)
            start = len(request)
            part = [-1] * (hi - lo)
            for _, start_pos, count, prefix_start in seg_runs:
                part[start_pos - lo:start_pos - lo + count] = range(prefix_start,
                                                                    prefix_start + count)
            request.extend(part)
            widened.append(HitRun(seg, lo, hi - lo, start))
            crcs = self._crcs.get(seg.segment_id, ())
            lay = seg.layout
            held: tuple[int, ...] = ()
            rows: tuple[int, ...] = ()
            whole = hi - lo == seg.num_blocks
            if lay.is_windowed:
                held = tuple(lay.layer_first(k) for k in range(lay.num_layers))
                rows = tuple(lay.row_shift(k) for k in range(lay.num_layers))
                # Whole: every row of each layer read, or none (a view reading some of
                # a layer's rows, e.g. the window before a hit end, checks block crcs).
                whole = whole and all(h >= lay.num_blocks or h == lay.row_first(k)
                                      for k, h in enumerate(held))
            self.checks.append(StreamCheck(start, hi - lo, crcs,
                                           min(r.prefix_start for r in seg_runs),
                                           seg.segment_id, lo, whole,
                                           held, rows if rows != held else ()))
        self.stream_request = request
        return plan_reads(widened, num_layers, cfg)
