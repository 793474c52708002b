"""The read planner's totals, computed in bulk for the simulator.

``plan.reads.plan_reads`` builds every ``ReadOp`` and ``Piece`` of a restore: about
``num_layers x segments`` Python objects (6,100 for a 100-turn history of a 61-layer
model, ~27 ms). The simulator plans tens of thousands of restores and only needs the
totals (commands, bytes read, useful and gap bytes, arena copies), so this module
computes exactly those totals with the same rules, vectorised over layers and runs:

1. per layer, each run wants ``[base + l * stride, + length)``; widened to 4 KiB;
2. ranges of one file, sorted by offset, merge when they overlap or touch (after the
   widening) or the hole between them is ``< gap_limit_bytes``;
3. a merged read longer than ``max_read_bytes`` counts ``ceil(length / max)`` commands.

Memory runs count one copy per maximal exactly-adjacent group per layer.

Within one file the layer-``l`` ranges keep the same order in every layer (segments do
not overlap, and blocks of a segment keep their order inside each layer), so a merged
read's end is always the end of its last range. ``tests/plan/test_bulk.py`` checks
the totals against ``plan_reads`` on random hits.

``stream_totals`` is what the replay plans with: the totals of the plan the store and the
vLLM connector execute (``plan.stream.StreamPlanner``: each SSD segment read over the
span of its wanted blocks when it has block crcs, else whole, so every byte served is
checked against its crc32).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from flatcake.config import PlannerConfig
from flatcake.control.address import Medium
from flatcake.control.index import HitRun
from flatcake.layout import ALIGN, SegmentLayout, describe_layers
from flatcake.readplan import ReadPlan

SegmentCache = dict[int, tuple[bool, int, int, int, int, tuple[int, ...], tuple[int, ...],
                               tuple[int, ...], SegmentLayout | None, int]]
"""segment_id -> (on_ssd, file_id, base, header_bytes, num_blocks, layer_block_bytes,
layer_window_blocks, released layers, the layout when it keeps rows at hit ends inside
it (``ends``), read_end); the released layers and the
view's read_end are checked on every use (a newer turn may release a segment's window
rows while it lives; ``control.windows.restore_view`` makes a view per restore);
``base`` is the file offset (SSD: the segment's own) or arena offset. A live
segment's address never changes and segment ids are never reused, so entries stay true
for as long as the segment lives."""


def plan_totals(runs: Sequence[HitRun], num_layers: int, cfg: PlannerConfig | None = None,
                *,
                segment_cache: SegmentCache | None = None,
                whole_ssd_segments: bool = False) -> ReadPlan:
    """The totals of ``plan_reads(runs, num_layers, cfg)`` as a ``ReadPlan``
    whose ``layers`` is empty (every count and byte total is filled in).

    ``segment_cache`` (optional) remembers each segment's static geometry between calls.
    ``whole_ssd_segments``: plan each SSD segment of the runs once, as the stream
    planner reads it: the span of its wanted blocks with block crcs, else whole (see
    ``stream_totals``).
    """
    cfg = cfg if cfg is not None else PlannerConfig()
    if not isinstance(num_layers, int) or num_layers <= 0:
        raise ValueError(f"num_layers must be a positive int, got {num_layers!r}")
    if not runs:
        return ReadPlan((), 0, (), 0, 0, 0, 0, 0, 0)
    cache = segment_cache if segment_cache is not None else {}
    ssd: list[tuple[int, int, int, int]] = []
    mem: list[tuple[int, int, int]] = []
    mixed: list[tuple[int, int, int, int, int, int, int, int]] = []
    released: list[tuple[int, ...]] = []  # mixed runs' released layers, by index
    ends_layouts: list[SegmentLayout] = []  # mixed runs' layouts with ends, by index
    sizes: tuple[int, ...] = ()
    windows: tuple[int, ...] = ()
    bbpl = 0
    num_blocks = 0
    ssd_medium = Medium.SSD
    widened: set[int] = set()
    spans: dict[int, tuple[int, int]] = {}
    if whole_ssd_segments:
        for seg, start, count, _prefix_start in runs:
            if seg.medium is ssd_medium:
                lo, hi = spans.get(seg.segment_id, (start, start + count))
                spans[seg.segment_id] = ((min(lo, start), max(hi, start + count))
                                         if seg.layout.block_crcs else (0, seg.num_blocks))
    for seg, start, count, _prefix_start in runs:
        info = cache.get(seg.segment_id)
        lay = seg.layout
        if info is None or info[7] != lay.released or info[9] != lay.read_end:
            on_ssd = seg.medium is ssd_medium
            if on_ssd:
                fid, base = int(seg.file_id or 0), int(seg.file_offset or 0)
            else:
                fid, base = -1, seg.offset
            info = (on_ssd, fid, base, lay.header_bytes, lay.num_blocks,
                    lay.layer_block_bytes, lay.layer_window_blocks, lay.released,
                    lay if lay.ends else None, lay.read_end)
            cache[seg.segment_id] = info
        (on_ssd, fid, base, header, n_seg, seg_sizes, seg_windows, seg_released, ends_lay,
         read_end) = info
        if seg_sizes is not sizes and seg_sizes != sizes:
            if len(seg_sizes) != num_layers:
                raise ValueError(f"num_layers={num_layers} but segment {seg.segment_id} "
                                 f"holds {len(seg_sizes)} layers")
            if sizes:
                raise ValueError(f"segment {seg.segment_id} has geometry "
                                 f"{describe_layers(seg_sizes)}, expected "
                                 f"{describe_layers(sizes)}")
            sizes = seg_sizes
            bbpl = sizes[0] if len(set(sizes)) == 1 and not seg_windows else 0
            windows = seg_windows
        if count <= 0 or start < 0 or start + count > n_seg:
            raise ValueError(f"run start_pos={start} count={count} is outside segment "
                             f"{seg.segment_id} of {n_seg} blocks")
        if whole_ssd_segments and on_ssd:
            if seg.segment_id in widened:
                continue
            widened.add(seg.segment_id)
            lo, hi = spans[seg.segment_id]
            start, count = lo, hi - lo
        num_blocks += count
        if not bbpl:  # layers of different sizes: see _mixed_totals
            rel = sp = -1
            if seg_released:
                rel = len(released)
                released.append(seg_released)
            if ends_lay is not None:
                sp = len(ends_layouts)
                ends_layouts.append(ends_lay)
            mixed.append((fid if on_ssd else -1, base + header, n_seg, start, count, rel,
                          sp, read_end))
        # layout.block_offset(0, start), inlined; the layer stride is the segment's.
        elif on_ssd:
            ssd.append((fid, base + header + start * bbpl, n_seg * bbpl, count * bbpl))
        else:
            mem.append((base + header + start * bbpl, n_seg * bbpl, count * bbpl))
    if mixed:
        return _mixed_totals(mixed, sizes, num_blocks, cfg, windows, released,
                             ends_layouts)
    num_commands = bytes_read = useful = 0
    if ssd:
        ssd.sort()
        useful = sum(length for _f, _b, _s, length in ssd) * num_layers
        apart = _apart_totals(ssd, num_layers, cfg)
        if apart is None:
            num_commands, bytes_read = _merged_totals(ssd, num_layers, cfg)
        else:
            num_commands, bytes_read = apart
    num_copies = memory_bytes = 0
    if mem:
        mem.sort()
        joins = 0
        for k in range(len(mem) - 1):
            a_base, a_stride, a_len = mem[k]
            b_base, b_stride, _b_len = mem[k + 1]
            d = a_base + a_len - b_base
            if d > 0:
                raise ValueError("two runs of the hit read the same bytes")
            # Layer l of b starts where layer l of a ends: l * (b_stride - a_stride) == d.
            ds = b_stride - a_stride
            if ds == 0:
                joins += num_layers if d == 0 else 0
            elif d % ds == 0 and 0 <= d // ds < num_layers:
                joins += 1
        num_copies = num_layers * len(mem) - joins
        memory_bytes = sum(length for _b, _s, length in mem) * num_layers
    return ReadPlan(
        layers=(),
        num_blocks=num_blocks,
        layer_block_bytes=sizes,
        num_commands=num_commands,
        useful_bytes=useful,
        gap_bytes=bytes_read - useful,
        bytes_read=bytes_read,
        num_copies=num_copies,
        memory_bytes=memory_bytes,
    )


def stream_totals(runs: Sequence[HitRun], num_layers: int, cfg: PlannerConfig | None = None,
                  *,
                  segment_cache: SegmentCache | None = None) -> ReadPlan:
    """The totals of ``StreamPlanner``'s plan for ``runs`` (each SSD segment read over
    its wanted blocks' span, or whole without block crcs): the same commands and bytes
    the data path reads."""
    return plan_totals(runs, num_layers, cfg, segment_cache=segment_cache,
                       whole_ssd_segments=True)


def _apart_totals(ssd: list[tuple[int, int, int, int]], num_layers: int,
                  cfg: PlannerConfig) -> tuple[int, int] | None:
    """``(commands, bytes)`` when no two ranges of one layer can merge (each range is
    then its own read; a run's totals over the layers depend on the run alone and are
    cached), else ``None``. ``ssd`` is sorted; raises on runs reading the same bytes."""
    gap = max(cfg.gap_limit_bytes, 1)
    slack = 2 * (ALIGN - 1)
    last = num_layers - 1
    for k in range(len(ssd) - 1):
        a_fid, a_base, a_stride, a_len = ssd[k]
        b_fid, b_base, b_stride, _b_len = ssd[k + 1]
        if a_fid != b_fid:
            continue
        if a_base + a_len > b_base:
            raise ValueError("two runs of the hit read the same bytes")
        # The hole between them in layer l, after the 4 KiB widening, is at least
        # b_base - a_base - a_len - slack + l * (b_stride - a_stride).
        if b_base - a_base - a_len - slack + min(0, last * (b_stride - a_stride)) < gap:
            return None
    num_commands = bytes_read = 0
    max_len = cfg.max_read_bytes
    for _fid, base, stride, length in ssd:
        cmds, nbytes = _run_totals(base, stride, length, num_layers, max_len)
        num_commands += cmds
        bytes_read += nbytes
    return num_commands, bytes_read


@functools.lru_cache(maxsize=1 << 16)
def _run_totals(base: int, stride: int, length: int, num_layers: int,
                max_len: int) -> tuple[int, int]:
    """``(commands, bytes)`` of one run's ranges, each read alone, widened to 4 KiB."""
    num_commands = bytes_read = 0
    for layer in range(num_layers):
        lo = base + layer * stride
        width = ((lo + length + ALIGN - 1) & -ALIGN) - (lo & -ALIGN)
        bytes_read += width
        num_commands += -(-width // max_len)
    return num_commands, bytes_read


def _merged_totals(ssd: list[tuple[int, int, int, int]], num_layers: int,
                   cfg: PlannerConfig) -> tuple[int, int]:
    """``(commands, bytes)`` of the sorted ranges, merged per layer (rules 1-3)."""
    layers = np.arange(num_layers, dtype=np.int64)[:, None]
    arr = np.asarray(ssd, dtype=np.int64)
    file_id, base_a, stride, length = arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3]
    _reject_overlaps(file_id, base_a, length)
    return _grouped_totals(file_id, layers * stride + base_a, length, cfg)


def _grouped_totals(file_id: np.ndarray, want_lo: np.ndarray, length: np.ndarray,
                    cfg: PlannerConfig) -> tuple[int, int]:
    """``(commands, bytes)`` of ranges ``[want_lo, + length)`` (layers x runs, runs
    sorted by file and offset), merged per layer (rules 1-3)."""
    cmds, nbytes = _layer_grouped_totals(file_id, want_lo, length, cfg)
    return int(cmds.sum()), nbytes


def _layer_grouped_totals(file_id: np.ndarray, want_lo: np.ndarray, length: np.ndarray,
                          cfg: PlannerConfig) -> tuple[np.ndarray, int]:
    """``_grouped_totals`` with the commands of each layer (a row of ``want_lo``)."""
    lo = want_lo & -ALIGN
    hi = (want_lo + (length + ALIGN - 1)) & -ALIGN
    max_len = cfg.max_read_bytes
    hole = lo[:, 1:] - hi[:, :-1]
    # Overlapping or touching ranges merge, and holes under the gap limit.
    merge = (file_id[1:] == file_id[:-1]) & (hole < max(cfg.gap_limit_bytes, 1))
    new = np.ones(lo.shape, dtype=bool)
    new[:, 1:] = ~merge
    flat_new = new.ravel()
    starts = np.flatnonzero(flat_new)
    ends = np.append(starts[1:], flat_new.size) - 1
    glen = hi.ravel()[ends] - lo.ravel()[starts]
    per_layer = np.bincount(starts // lo.shape[1], weights=-(-glen // max_len),
                            minlength=lo.shape[0]).astype(np.int64)
    return per_layer, int(glen.sum())


def _reject_overlaps(file_id: np.ndarray, base: np.ndarray, length: np.ndarray) -> None:
    """Like ``plan_reads``: two runs reading the same bytes are an error (a lookup never
    returns them; a hand-made hit might)."""
    if len(base) > 1:
        bad = (file_id[1:] == file_id[:-1]) & (base[:-1] + length[:-1] > base[1:])
        if bad.any():
            raise ValueError("two runs of the hit read the same bytes")


def _mixed_totals(runs: list[tuple[int, int, int, int, int, int, int, int]],
                  sizes: tuple[int, ...],
                  num_blocks: int, cfg: PlannerConfig, windows: tuple[int, ...] = (),
                  released: Sequence[tuple[int, ...]] = (),
                  ends_layouts: Sequence[SegmentLayout] = ()) -> ReadPlan:
    """The totals for layers of different sizes or with windows. ``runs`` holds
    ``(file_id or -1 for the arena, data start, segment blocks, first block, blocks,
    index of its released layers in released or -1, index of its layout in
    ends_layouts or -1, read_end)``; layer ``l`` of a run is ``[data + n * before[l] +
    start * size[l], + count * size[l])``; a windowed layer holds its last ``min(n,
    window)`` blocks only, none once released, and a view reads it from ``read_end -
    window`` on (``layout.SegmentLayout``); a segment keeping rows at hit ends inside it
    is read as its layout says."""
    runs.sort()
    size = np.asarray(sizes, dtype=np.int64)[:, None]  # (layers, 1)
    before = np.concatenate(([0], np.cumsum(size[:-1, 0])))[:, None]
    arr = np.asarray(runs, dtype=np.int64)
    on_ssd = arr[:, 0] >= 0
    num_commands = bytes_read = useful = 0
    num_copies = memory_bytes = 0
    layer_commands: tuple[int, ...] = ()
    for ssd_side in (True, False):
        part = arr[on_ssd == ssd_side]
        if not len(part):
            continue
        file_id, data, n_seg, start, count, rel, sp, read_end = part.T
        if windows:
            gone = None
            if released:
                gone = np.zeros((len(sizes), len(rel)), dtype=bool)
                for r in np.flatnonzero(rel >= 0):
                    gone[list(released[rel[r]]), r] = True
            lo, length, seg_bytes = _windowed_ranges(data, n_seg, start, count, size,
                                                     windows, gone, read_end)
            for r in np.flatnonzero(sp >= 0):
                _ends_ranges(ends_layouts[sp[r]], int(data[r]), int(start[r]),
                             int(count[r]), size[:, 0], lo[:, r], length[:, r])
                seg_bytes[r] = ends_layouts[sp[r]].data_bytes
            _reject_windowed_overlaps(file_id, data, start, count, seg_bytes)
        else:
            lo = data + n_seg * before + start * size  # (layers, runs)
            length = count * size
            _reject_overlaps(file_id, lo[0], length[0])
        if ssd_side:
            useful = int(length.sum())
            per_layer, bytes_read = _held_totals(file_id, lo, length, cfg)
            num_commands = int(per_layer.sum())
            layer_commands = tuple(per_layer.tolist())
        else:
            held = length > 0
            joins = (lo[:, :-1] + length[:, :-1] == lo[:, 1:]) & held[:, :-1] & held[:, 1:]
            if not held.all():  # a run holding nothing joins across: drop it per layer
                joins = np.asarray([_joins(lo[k][held[k]], length[k][held[k]])
                                    for k in range(len(lo))])
            num_copies = int(held.sum() - joins.sum())
            memory_bytes = int(length.sum())
    return ReadPlan((), num_blocks, sizes, num_commands, useful, bytes_read - useful,
                    bytes_read, num_copies, memory_bytes, layer_commands)


def _windowed_ranges(data: np.ndarray, n_seg: np.ndarray, start: np.ndarray,
                     count: np.ndarray, size: np.ndarray, windows: tuple[int, ...],
                     gone: np.ndarray | None = None, read_end: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(lo, length)`` (layers, runs) of the blocks each layer holds of each run
    (``SegmentLayout.layer_first``: a windowed layer holds its segment's last
    ``min(n, window)`` blocks, none where
    ``gone``: released, read from ``read_end - window`` on where ``read_end``);
    ``length`` 0 where it holds none of the run; and each run's segment data bytes."""
    win = np.asarray(windows, dtype=np.int64)[:, None]
    first = np.where(win > 0, n_seg - np.minimum(n_seg, win), 0)  # (layers, runs)
    rows = n_seg - first
    before = np.cumsum(rows * size, axis=0) - rows * size
    lo_blk = np.maximum(start, first if gone is None else np.where(gone, n_seg, first))
    if read_end is not None and read_end.any():
        lo_blk = np.where((win > 0) & (read_end > 0),
                          np.maximum(lo_blk, read_end - win), lo_blk)
    held = np.maximum(start + count - lo_blk, 0)
    return data + before + (lo_blk - first) * size, held * size, (rows * size).sum(axis=0)


def _ends_ranges(lay: SegmentLayout, data: int, start: int, count: int, size: np.ndarray,
                 lo: np.ndarray, length: np.ndarray) -> None:
    """``lo`` and ``length`` (each layer) of a run of a segment keeping rows at hit ends
    inside it, filled in from its layout (a view: ``layout.SegmentLayout.layer_first``
    on, one run of rows)."""
    for k in range(len(size)):
        first = max(start, lay.layer_first(k))
        held = max(0, start + count - first)
        lo[k] = data + lay.layer_offset(k) - lay.header_bytes + \
            (first - lay.row_shift(k)) * int(size[k]) if held else data
        length[k] = held * int(size[k])


def _reject_windowed_overlaps(file_id: np.ndarray, data: np.ndarray, start: np.ndarray,
                              count: np.ndarray, seg_bytes: np.ndarray) -> None:
    """``_reject_overlaps`` for windowed segments (``plan.reads._overlap``): runs of one
    segment overlapping, or a segment's data reaching into the next one's."""
    if len(data) > 1:
        same_file = file_id[1:] == file_id[:-1]
        same_seg = data[1:] == data[:-1]
        bad = same_file & np.where(same_seg, start[:-1] + count[:-1] > start[1:],
                                   data[:-1] + seg_bytes[:-1] > data[1:])
        if bad.any():
            raise ValueError("two runs of the hit read the same bytes")


def _held_totals(file_id: np.ndarray, lo: np.ndarray, length: np.ndarray,
                 cfg: PlannerConfig) -> tuple[np.ndarray, int]:
    """``_layer_grouped_totals``, leaving out of a layer the runs it holds none of."""
    held = length > 0
    if held.all():
        return _layer_grouped_totals(file_id, lo, length, cfg)
    per_layer = np.zeros(len(lo), dtype=np.int64)
    bytes_read = 0
    for k in range(len(lo)):
        keep = held[k]
        if keep.any():
            cmds, nbytes = _grouped_totals(file_id[keep], lo[k][keep][None, :],
                                           length[k][keep][None, :], cfg)
            per_layer[k] = cmds
            bytes_read += nbytes
    return per_layer, bytes_read


def _joins(lo: np.ndarray, length: np.ndarray) -> int:
    """Exactly adjacent neighbours among one layer's sorted ranges."""
    return int((lo[:-1] + length[:-1] == lo[1:]).sum())
