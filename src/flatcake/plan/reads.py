"""Read planning (FC-CIO): turn a prefix hit into per-layer read and copy operations.

Pure: no I/O. Executors (O_DIRECT thread pool, kvikio, the replay simulator's device
model) carry out the plan; the planner only decides *what* to read.

Per layer ``l`` (a restore fills a staging window layer by layer), every SSD run of the
hit wants one contiguous range ``[file_offset + layout.block_offset(l, start), +count *
layout.layer_block_bytes[l])`` of one file (layers may differ in size). The planner

1. widens each range to 4 KiB alignment (O_DIRECT/GDS rule: offsets and lengths are
   multiples of 4096) and counts the widening as gap bytes;
2. sorts by ``(file_id, offset)`` and merges ranges of the same file that overlap,
   touch, or are separated by a hole *smaller than* ``gap_limit_bytes`` (the hole is
   read and counted as gap bytes);
3. splits merged reads longer than ``max_read_bytes`` into ``max_read_bytes`` chunks
   (still aligned) so several commands stay in flight.

Memory runs become arena copies, merged only when exactly adjacent.

A history written as T segments therefore restores in at most ``num_layers * T`` SSD
commands (before step 3's splits): one per segment and layer at worst, fewer when a
layer's ranges merge.

A sliding-window layer of a segment holds its last blocks only
(``SegmentLayout.layer_first``): its range is the run's blocks it holds, and a run
holding none of them reads nothing in that layer. The books end a hit where every
window is held (``control.windows``), so the blocks a next turn's window needs are
always among them.

The plan's value types and where their bytes go: ``flatcake.readplan``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

from flatcake.config import PlannerConfig
from flatcake.control.address import Medium
from flatcake.control.index import HitRun
from flatcake.layout import ALIGN, SegmentLayout, describe_layers
from flatcake.readplan import CopyOp, LayerPlan, Piece, ReadOp, ReadPlan


class _Span(NamedTuple):
    """A run: blocks ``[start, start + blocks)`` of a segment of ``num_blocks`` blocks whose
    data starts at ``data`` (file offset on SSD, arena offset in memory)."""

    file_id: int  # -1 for memory
    data: int
    num_blocks: int
    start: int
    blocks: int
    prefix_start: int
    windowed: SegmentLayout | None = None  # the layout, where a layer holds a window


class _Layer(NamedTuple):
    """Where one layer lies in every segment: at ``num_blocks * before`` from the data
    start, ``block_bytes`` per block (a windowed segment: from its layout)."""

    before: int
    block_bytes: int
    number: int = 0

    def range(self, s: _Span) -> tuple[int, int]:
        """``(offset, length)`` of the run ``s`` in this layer."""
        return (s.data + s.num_blocks * self.before + s.start * self.block_bytes,
                s.blocks * self.block_bytes)

    def held(self, s: _Span) -> tuple[int, int, int]:
        """``(offset, length, first request block)`` of the blocks of the run ``s`` this
        layer holds (``length`` 0: none)."""
        lay = s.windowed
        if lay is None:
            lo, length = self.range(s)
            return lo, length, s.prefix_start
        first = max(s.start, lay.layer_first(self.number))
        count = s.start + s.blocks - first
        if count <= 0:
            return 0, 0, s.prefix_start
        return (s.data - lay.data_offset + lay.block_offset(self.number, first),
                count * self.block_bytes, s.prefix_start + first - s.start)


def _spans(runs: Sequence[HitRun]) -> tuple[list[_Span], list[_Span], tuple[int, ...]]:
    ssd: list[_Span] = []
    mem: list[_Span] = []
    sizes: tuple[int, ...] = ()
    for seg, start, count, prefix_start in runs:
        lay = seg.layout
        if not sizes:
            sizes = lay.layer_block_bytes
        elif lay.layer_block_bytes != sizes:
            raise ValueError(
                f"segment {seg.segment_id} has geometry "
                f"{describe_layers(lay.layer_block_bytes)}, expected {describe_layers(sizes)}"
            )
        if count <= 0 or start < 0 or start + count > lay.num_blocks:
            raise ValueError(f"run start_pos={start} count={count} is outside segment "
                             f"{seg.segment_id} of {lay.num_blocks} blocks")
        if seg.medium == Medium.SSD:
            # Segment.__post_init__ guarantees both are set on SSD.
            file_id, file_offset = int(seg.file_id or 0), int(seg.file_offset or 0)
            ssd.append(_Span(file_id, file_offset + lay.data_offset, lay.num_blocks, start,
                             count, prefix_start, lay if lay.is_windowed else None))
        else:
            mem.append(_Span(-1, seg.offset + lay.data_offset, lay.num_blocks, start, count,
                             prefix_start, lay if lay.is_windowed else None))
    # Within a file (or the arena) the order of the ranges is the same in every layer:
    # segments do not overlap, and inside one segment every layer keeps block order.
    ssd.sort(key=lambda s: (s.file_id, s.data, s.start))
    mem.sort(key=lambda s: (s.data, s.start))
    # Two runs overlap in some layer iff they overlap in layer 0 (segments are disjoint;
    # runs of one segment keep their order). A lookup never returns overlapping runs; a
    # hand-made hit might.
    if sizes:
        for spans in (ssd, mem):
            for a, b in itertools.pairwise(spans):
                if a.file_id == b.file_id and _overlap(a, b, sizes[0]):
                    raise ValueError(f"runs at request blocks {a.prefix_start} and "
                                     f"{b.prefix_start} read the same bytes")
    return ssd, mem, sizes


def _overlap(a: _Span, b: _Span, size0: int) -> bool:
    """Runs ``a`` and ``b`` (sorted, same file) read the same bytes: the same segment's
    blocks, or ``a``'s segment reaching into ``b``'s (a window keeps layer 0 shorter:
    ``a``'s whole data then)."""
    if a.windowed is None and b.windowed is None:
        first = _Layer(0, size0)
        a_lo, a_len = first.range(a)
        return a_lo + a_len > first.range(b)[0]
    if a.data == b.data:
        return a.start + a.blocks > b.start
    end = a.windowed.data_bytes if a.windowed is not None else a.num_blocks * size0
    return a.data + end > b.data


def _split_pieces(pieces: list[Piece], op_start: int, op_len: int, max_len: int
                  ) -> list[tuple[int, int, tuple[Piece, ...]]]:
    """Cut one merged read ``[op_start, op_start + op_len)`` into ``max_len`` chunks."""
    out: list[tuple[int, int, tuple[Piece, ...]]] = []
    for chunk_lo in range(0, op_len, max_len):
        chunk_hi = min(chunk_lo + max_len, op_len)
        sub: list[Piece] = []
        for p in pieces:
            lo = max(p.offset_in_op, chunk_lo)
            hi = min(p.offset_in_op + p.length, chunk_hi)
            if lo >= hi:
                continue
            sub.append(Piece(p.dest_offset + lo - p.offset_in_op, lo - chunk_lo, hi - lo))
        out.append((op_start + chunk_lo, chunk_hi - chunk_lo, tuple(sub)))
    return out


def _plan_ssd_layer(spans: list[_Span], before: int, size: int, number: int,
                    gap_limit: int, max_len: int) -> tuple[tuple[ReadOp, ...], int]:
    """Layer ``number``'s reads (its data ``before`` bytes per block into a segment,
    ``size`` bytes a block) and the bytes they read."""
    ops: list[ReadOp] = []
    bytes_read = 0
    cur_file = -1
    cur_lo = cur_hi = 0
    pieces: list[Piece] = []
    layer: _Layer | None = None  # made once, at the layer's first windowed run
    for s in spans:
        file_id, data, num_blocks, start, blocks, at, windowed = s  # unpacked at C speed
        if windowed is None:  # ``_Layer.held`` of a run every layer holds, inline
            want_lo = data + num_blocks * before + start * size
            want_len = blocks * size
        else:
            if layer is None:
                layer = _Layer(before, size, number)
            want_lo, want_len, at = layer.held(s)
            if not want_len:
                continue
        lo = want_lo - want_lo % ALIGN
        hi = -(-(want_lo + want_len) // ALIGN) * ALIGN
        # Overlapping or touching ranges always merge; a hole merges when it is
        # smaller than the gap limit.
        if pieces and file_id == cur_file and (lo <= cur_hi or lo - cur_hi < gap_limit):
            if hi > cur_hi:
                cur_hi = hi
        else:
            if pieces:
                bytes_read += _flush(ops, cur_file, cur_lo, cur_hi, pieces, max_len)
            cur_file, cur_lo, cur_hi, pieces = file_id, lo, hi, []
        pieces.append(_piece(Piece, (at * size, want_lo - cur_lo, want_len)))
    if not pieces:
        return (), 0
    if not ops and cur_hi - cur_lo <= max_len:  # one read (most layers): no list
        return (ReadOp(cur_file, cur_lo, cur_hi - cur_lo, tuple(pieces)),), cur_hi - cur_lo
    bytes_read += _flush(ops, cur_file, cur_lo, cur_hi, pieces, max_len)
    return tuple(ops), bytes_read


# A ``Piece`` built in C (a NamedTuple's own ``__new__`` is Python): the planner makes
# one per run and layer, so a long hit's plan makes thousands.
_piece = tuple.__new__


def _flush(ops: list[ReadOp], file_id: int, lo: int, hi: int, pieces: list[Piece],
           max_len: int) -> int:
    """Append the merged read ``[lo, hi)`` of ``file_id`` to ``ops`` (in ``max_len``
    chunks); returns its length."""
    length = hi - lo
    if length <= max_len:
        ops.append(ReadOp(file_id, lo, length, tuple(pieces)))
    else:
        for at, n, sub in _split_pieces(pieces, lo, length, max_len):
            ops.append(ReadOp(file_id, at, n, sub))
    return length


def _plan_memory_layer(spans: list[_Span], layer: _Layer) -> list[CopyOp]:
    ops: list[CopyOp] = []
    cur_lo = cur_hi = -1
    pieces: list[Piece] = []
    for s in spans:
        lo, length, at = layer.held(s)
        if not length:
            continue
        if pieces and lo == cur_hi:
            pieces.append(Piece(at * layer.block_bytes, lo - cur_lo, length))
            cur_hi += length
            continue
        if pieces:
            ops.append(CopyOp(cur_lo, cur_hi - cur_lo, tuple(pieces)))
        cur_lo, cur_hi = lo, lo + length
        pieces = [Piece(at * layer.block_bytes, 0, length)]
    if pieces:
        ops.append(CopyOp(cur_lo, cur_hi - cur_lo, tuple(pieces)))
    return ops


def plan_reads(
    runs: Sequence[HitRun],
    num_layers: int,
    cfg: PlannerConfig | None = None,
) -> ReadPlan:
    """Plan the reads of a prefix hit (``PrefixHit.runs``), layer by layer.

    Args:
        runs: the hit's runs (any order; each is one contiguous range per layer).
        num_layers: layers to plan; must equal the segments' ``layout.num_layers``.
        cfg: gap limit and maximum read size (defaults: 64 KiB, 64 MiB).
    """
    cfg = cfg if cfg is not None else PlannerConfig()
    if not isinstance(num_layers, int) or num_layers <= 0:
        raise ValueError(f"num_layers must be a positive int, got {num_layers!r}")
    ssd, mem, sizes = _spans(runs)
    if runs and len(sizes) != num_layers:
        raise ValueError(f"num_layers={num_layers} but the segments hold {len(sizes)} layers")
    num_blocks = sum(r.num_blocks for r in runs)
    ssd_blocks = sum(s.blocks for s in ssd)
    mem_blocks = sum(s.blocks for s in mem)
    layers: list[LayerPlan] = []
    num_commands = num_copies = bytes_read = 0
    useful = ssd_blocks * sum(sizes)
    memory_bytes = mem_blocks * sum(sizes)
    windowed = any(s.windowed is not None for s in (*ssd, *mem))
    if windowed:
        useful = memory_bytes = 0
    gap_limit, max_len = cfg.gap_limit_bytes, cfg.max_read_bytes
    ssd_ops: tuple[ReadOp, ...] = ()
    mem_ops: tuple[CopyOp, ...] = ()
    for index, (before, size) in enumerate(zip(
            itertools.accumulate(sizes, initial=0), sizes, strict=False)):
        if ssd:
            ssd_ops, layer_read = _plan_ssd_layer(ssd, before, size, index, gap_limit,
                                                  max_len)
            num_commands += len(ssd_ops)
            bytes_read += layer_read
        if mem:
            mem_ops = tuple(_plan_memory_layer(mem, _Layer(before, size, index)))
            num_copies += len(mem_ops)
        layers.append(LayerPlan(index, ssd_ops, mem_ops))
        if windowed:
            useful += sum(p.length for op in ssd_ops for p in op.pieces)
            memory_bytes += sum(op.length for op in mem_ops)
    return ReadPlan(
        layers=tuple(layers),
        num_blocks=num_blocks,
        layer_block_bytes=sizes,
        num_commands=num_commands,
        useful_bytes=useful,
        gap_bytes=bytes_read - useful,
        bytes_read=bytes_read,
        num_copies=num_copies,
        memory_bytes=memory_bytes,
    )
