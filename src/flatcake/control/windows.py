"""Where a hit may end for a model with sliding-window layers.

A segment keeps a windowed layer's last ``min(n, window)`` blocks only
(``layout.SegmentLayout``). A restore that ends at request block ``E`` needs, in a
layer of window ``w`` blocks, the blocks ``[E - w, E)``; they are all held when ``E``
is the end of a segment whose history was written turn by turn (each earlier segment
holds its own last ``w`` blocks). A hit ending elsewhere (a branch inside a segment, a
run through another session's segment) is cut back to the last run boundary where
every window is held, so a restore never returns a block without its window.
"""

from __future__ import annotations

from flatcake.control.address import Medium
from flatcake.control.index import EMPTY_HIT, HitRun, PrefixHit


def window_held(runs: tuple[HitRun, ...], end_run: int, window: int) -> bool:
    """Every block of the ``window`` blocks before the end of ``runs[end_run]`` is held
    by a layer of that window (blocks before the request's start need nothing)."""
    need = window
    for k in range(end_run, -1, -1):
        seg, start, count, _prefix = runs[k]
        n = seg.layout.num_blocks
        take = min(need, count)
        if start + count - take < n - min(n, window):
            return False
        need -= take
        if need <= 0:
            return True
    return True


def windowed_hit(hit: PrefixHit, windows: tuple[int, ...]) -> PrefixHit:
    """``hit``, cut back to its last run boundary where every window of ``windows``
    (each layer's window in blocks; 0 none) is held (``hit`` itself when its end is)."""
    distinct = sorted({w for w in windows if w})
    runs = hit.runs
    for end in range(len(runs) - 1, -1, -1):
        if all(window_held(runs, end, w) for w in distinct):
            if end == len(runs) - 1:
                return hit
            kept = runs[:end + 1]
            ssd = sum(r[2] for r in kept if r[0].medium is Medium.SSD)
            total = sum(r[2] for r in kept)
            return PrefixHit(total, total - ssd, ssd, kept)
    return EMPTY_HIT
