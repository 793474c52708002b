"""Where a hit may end for a model with sliding-window layers, and which window rows a
newer turn releases.

A segment keeps a windowed layer's last ``min(n, window)`` blocks only
(``layout.SegmentLayout``). A restore that ends at request block ``E`` needs, in a
layer of window ``w`` blocks, the blocks ``[E - w, E)``; they are all held when ``E``
is the end of a segment whose history was written turn by turn (each earlier segment
holds its own last ``w`` blocks). A hit ending elsewhere (a branch inside a segment, a
run through another session's segment, a turn whose rows were released) is cut back
to the last run boundary where every window is held, so a restore never returns a
block without its window.

Releasing (``store.release_old_windows``): once a turn ending at request block ``E``
is durable, the next turn reads the window ending at ``E``, not the windows of the
turns before it. So every SSD segment of the same session that the new turn's prefix
runs through to its end, at ``E_p <= E - w``, holds rows of a window layer ``w`` that
no window ending at ``E`` reads: those layers are released (``released_rows``), the
books stop serving them at once and the data plane punches their bytes out of the
file. A session then holds, per window layer, the rows of windows ending at its newest
turn only: at most ``w`` blocks when each turn adds ``w`` or more, and fewer than
``2 w`` otherwise (a segment straddling ``E - w`` keeps all its rows). The cost: a
branch off an older turn (or a hit ending there) finds no window held there and is cut
back, to nothing when every older turn is released; it recomputes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence

from flatcake.control.address import Medium
from flatcake.control.index import EMPTY_HIT, HitRun, PrefixHit, Segment, head_runs
from flatcake.layout import ALIGN, SegmentLayout


@functools.cache
def window_layers(windows: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """Each distinct window (blocks, > 0) with the first layer having it (all layers of
    a window are released together, so one stands for the rest). Cached: lookups ask
    for the geometry's on every hit."""
    return tuple((w, layers[0]) for w, layers in _layers_by_window(windows))


def window_held(runs: tuple[HitRun, ...], end_run: int, window: int,
                layer: int) -> bool:
    """Every block of the ``window`` blocks before the end of ``runs[end_run]`` is held
    by ``layer`` (a layer of that window; blocks before the request's start need
    nothing)."""
    need = window
    for k in range(end_run, -1, -1):
        seg, start, count, _prefix = runs[k]
        take = min(need, count)
        if not seg.layout.holds(layer, start + count - take, start + count):
            return False
        need -= take
        if need <= 0:
            return True
    return True


def windowed_hit(hit: PrefixHit, windows: tuple[int, ...]) -> PrefixHit:
    """``hit``, cut back to its last position where every window of ``windows`` (each
    layer's window in blocks; 0 none) is held: a run's end, or a block inside a run
    where its segment keeps rows (``layout``'s ``ends``); ``hit`` itself when its end
    is."""
    reps = window_layers(windows)
    runs = hit.runs
    for end in range(len(runs) - 1, -1, -1):
        seg, start, count, prefix = runs[end]
        for stop in _ends_within(seg.layout.ends, start, start + count):
            whole = stop == start + count
            last = (*runs[:end], runs[end] if whole else
                    HitRun(seg, start, stop - start, prefix))
            if all(window_held(last, end, w, layer) for w, layer in reps):
                return hit if whole and end == len(runs) - 1 else _hit_of(last)
    return EMPTY_HIT


def _ends_within(ends: tuple[tuple[int, int], ...], start: int, stop: int
                 ) -> Iterator[int]:
    """The blocks where a hit through ``[start, stop)`` of a segment may end, last
    first: ``stop``, then each of ``ends`` inside the run."""
    yield stop
    for lo, hi in reversed(ends):
        yield from range(min(hi, stop - 1), max(lo, start + 1) - 1, -1)


def _hit_of(runs: tuple[HitRun, ...]) -> PrefixHit:
    """The hit made of ``runs`` (prefix order, from the request's first block)."""
    ssd = sum(r[2] for r in runs if r[0].medium is Medium.SSD)
    total = sum(r[2] for r in runs)
    return PrefixHit(total, total - ssd, ssd, runs)


def window_segment_hit(hit: PrefixHit, keys: Sequence[bytes], windows: tuple[int, ...],
                       holders: Callable[[bytes], list[tuple[Segment, int]]]
                       ) -> PrefixHit | None:
    """``hit`` (every key of it indexed, its end's window not held along its runs)
    served through another live segment holding its last key at some position ``j``:
    one whose keys up to ``j`` are the request's just before, and whose windows are
    held there (a *window segment*, which a request whose whole prompt was already
    stored wrote, ending at ``j``; or a segment keeping rows where a hit may end inside
    it, ``layout``'s ``ends``: a branch, every stride blocks, every block). ``None`` when no such
    segment is live; where that segment holds no window at ``j``, the hit ends at its
    last block before ``j`` that does."""
    end = hit.num_blocks
    if not end:
        return None
    reps = window_layers(windows)
    best: PrefixHit | None = None
    for seg, j in holders(keys[end - 1]):
        start = end - 1 - j
        if start < 0 or tuple(keys[start:end]) != seg.keys[:j + 1]:
            continue
        head = head_runs(hit.runs, start)
        for stop in _ends_within(seg.layout.ends, 0, j + 1):
            if best is not None and start + stop <= best.num_blocks:
                break
            runs = (*head, HitRun(seg, 0, stop, start))
            if all(window_held(runs, len(runs) - 1, w, layer) for w, layer in reps):
                best = _hit_of(runs)
                break
    return best


def restore_view(runs: tuple[HitRun, ...]) -> tuple[HitRun, ...]:
    """``runs`` as a restore plans them: in an SSD run wholly before the window at the
    hit's end (its last block before ``end - w``), a windowed layer of ``w`` blocks is
    marked released (``SegmentLayout.release``), so the planner neither reads nor checks
    its rows: they are held where a hit may end at that segment, and no window ending at
    this hit's end reads them. Without it, a restore of ``T`` turns read every turn's
    window rows (on DeepSeek-V4-Flash 12.2 MB of compressor state per turn). The books'
    segments are unchanged (the view is for planning only)."""
    if not runs or not runs[0].segment.layout.layer_window_blocks:
        return runs
    end = max(r.prefix_start + r.num_blocks for r in runs)
    out = list(runs)
    for i, run in enumerate(runs):
        seg = run.segment
        lay = seg.layout
        if not lay.layer_window_blocks:
            continue
        stop = run.prefix_start + run.num_blocks
        drop = tuple(k for w, layers in _layers_by_window(lay.layer_window_blocks)
                     if stop <= end - w
                     for k in layers if k not in lay.released) \
            if seg.medium is Medium.SSD else ()
        # A segment holding rows before its last window (``ends``) is read from the
        # window before the run's end only (the window at the hit's end lies there, or
        # wholly in the runs after it).
        read_end = run.start_pos + run.num_blocks if lay.ends else 0
        if drop or read_end:
            view = dataclasses.replace(lay.release(drop) if drop else lay, read_end=read_end)
            out[i] = HitRun(dataclasses.replace(seg, layout=view), run.start_pos,
                            run.num_blocks, run.prefix_start)
    return tuple(out)


@functools.cache
def _layers_by_window(windows: tuple[int, ...]) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """Each distinct window (blocks, > 0) with every layer having it."""
    out: dict[int, list[int]] = {}
    for layer, w in enumerate(windows):
        if w:
            out.setdefault(w, []).append(layer)
    return tuple((w, tuple(layers)) for w, layers in out.items())


def released_rows(session_id: str, prefix: Sequence[HitRun], end: int,
                  windows: tuple[int, ...], keep_ends: bool = True
                  ) -> list[tuple[Segment, tuple[int, ...]]]:
    """What a turn of ``session_id`` ending at request block ``end``, written after the
    runs ``prefix``, releases: each SSD segment of the session that ``prefix`` runs
    through to its end, with its window layers whose rows all lie before ``end - w``
    and are not released yet (see the module docstring). A segment holding rows where a
    hit may end inside it (``layout``'s ``ends``: a branch, a stride) keeps them with
    ``keep_ends`` (other prompts sharing its prefix end their hits there); without it,
    they go with the rest (when the SSD needs the space)."""
    out = []
    for seg, start, count, prefix_start in prefix:
        lay = seg.layout
        if seg.medium is not Medium.SSD or seg.session_id != session_id or \
                start + count != lay.num_blocks or (keep_ends and lay.ends):
            continue
        seg_end = prefix_start + count
        layers = tuple(layer for layer, w in enumerate(windows)
                       if w and seg_end <= end - w and layer not in lay.released)
        if layers:
            out.append((seg, layers))
    return out


def window_pages(layout: SegmentLayout, window: int) -> tuple[tuple[int, int], ...]:
    """The whole 4 KiB pages (``(start, end)`` from the segment start) inside the rows
    of ``layout``'s layers of ``window``, adjacent layers merged: what releasing them
    gives back. Empty when their rows cover no whole page (they are then kept). The
    first page is the mark a restart reads: a hole there means released."""
    spans: list[list[int]] = []
    for layer, w in enumerate(layout.layer_window_blocks):
        if w != window:
            continue
        lo = layout.layer_offset(layer)
        hi = lo + layout.layer_bytes(layer)
        if spans and spans[-1][1] == lo:
            spans[-1][1] = hi
        else:
            spans.append([lo, hi])
    pages = ((-(-lo // ALIGN) * ALIGN, hi // ALIGN * ALIGN) for lo, hi in spans)
    return tuple((a, b) for a, b in pages if b > a)


def released_bytes(layout: SegmentLayout) -> int:
    """Bytes of ``layout``'s released layers given back to the filesystem: the whole
    pages of each released window's rows (``window_pages``, as a release punches)."""
    windows = {layout.layer_window_blocks[k] for k in layout.released}
    return sum(b - a for w in windows for a, b in window_pages(layout, w))


def delivered_bytes(runs: Sequence[HitRun], end: int, medium: Medium = Medium.SSD) -> int:
    """Bytes of ``runs`` on ``medium`` a restore ending at request block ``end`` hands
    the engine: every block of the layers that keep their history, and in a windowed
    layer of ``w`` blocks the blocks ``[end - w, end)`` only (the window the next turn
    attends to; older rows a segment still holds are not used)."""
    total = 0
    for seg, _start, count, prefix in runs:
        if seg.medium is not medium:
            continue
        lay = seg.layout
        windows = lay.layer_window_blocks or (0,) * lay.num_layers
        for size, w in zip(lay.layer_block_bytes, windows, strict=True):
            blocks = count if not w else max(0, prefix + count - max(prefix, end - w))
            total += blocks * size
    return total
