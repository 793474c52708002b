"""Releasing superseded window rows (``store.release_old_windows``): the books side.

When an SSD turn is published, ``after_publish`` finds the older segments of the same
session whose window rows no window ending at the new turn reads
(``windows.released_rows``) and keeps them as *candidates*: their rows stay where they
are, so a later hit that ends at that older turn (a branch, a sub-agent, a retry) finds
its window, and a restore that runs past them reads none of them
(``windows.restore_view``). They are the cheapest bytes a full SSD can give back (only
hits ending exactly there need them, and the session keeps every block): when a store
would cross the SSD high watermark, ``release`` releases candidates, oldest first,
before any whole session is dropped. Releasing one swaps the segment for the same
segment with those layers released (``SegmentLayout.release``: lookups stop there at
once, ``control.windows``), stops counting their pages against the SSD budget and the
session's bytes, and queues a ``WindowRelease`` for the data plane. ``take`` hands over
the releases no restore in flight reads (one planned before the swap may still read the
rows); the others wait for the next call. With ``store.release_windows_at_once`` every
candidate is released as soon as it is found. No I/O; single-threaded, like every verb.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Iterable, Mapping, Sequence

from flatcake.control.index import BlockIndex, HitRun, Segment
from flatcake.control.sessions import SessionTable
from flatcake.control.ssd_space import SsdSpace
from flatcake.control.types import LoadPlan, WindowRelease
from flatcake.control.windows import released_rows, window_pages


class Releases:
    """Owns the releases not handed over yet and the bytes released so far; writes the
    index (segments swapped for their released layout)."""

    def __init__(self, index: BlockIndex, ssd: SsdSpace, sessions: SessionTable,
                 windows: tuple[int, ...], at_once: bool = False) -> None:
        self._index = index
        self._ssd = ssd
        self._sessions = sessions
        self._windows = windows
        self._at_once = at_once  # store.release_windows_at_once
        self._queued: list[WindowRelease] = []
        # Superseded rows not released yet, oldest first: segment id -> its layers.
        self._candidates: dict[int, tuple[int, ...]] = {}
        self.released_bytes = 0

    def after_publish(self, seg: Segment, prefix: Sequence[HitRun], first_block: int) -> None:
        """``seg`` (SSD, written after the runs ``prefix``) was just published: the
        rows it supersedes become candidates (``release`` gives them back)."""
        end = first_block + seg.num_blocks
        # Rows at hit ends inside a segment (a branch, a stride) are released only when
        # the SSD needs the space, never at once.
        for old, layers in released_rows(seg.session_id, prefix, end, self._windows,
                                         keep_ends=self._at_once):
            had = self._candidates.pop(old.segment_id, ())
            self._candidates[old.segment_id] = tuple(sorted({*had, *layers}))
        if self._at_once:
            self.release(self._ssd.capacity_bytes + 1)

    @property
    def candidate_segments(self) -> int:
        """Segments holding superseded rows not released yet."""
        return len(self._candidates)

    def release(self, nbytes: int) -> int:
        """Release candidates, oldest first, until ``nbytes`` of SSD budget are given
        back (or none is left); returns the bytes given back."""
        if self._queued:  # a host that never takes them (the node service) holds
            live = self._index.has_segment  # those of live segments only
            self._queued = [r for r in self._queued if live(r.segment_id)]
        freed = 0
        while freed < nbytes and self._candidates:
            segment_id = next(iter(self._candidates))
            freed += self._release_one(segment_id, self._candidates.pop(segment_id))
        return freed

    def _release_one(self, segment_id: int, layers: tuple[int, ...]) -> int:
        cur = self._index.segment_or_none(segment_id)
        if cur is None or cur.file_id is None or cur.file_offset is None:
            return 0  # reclaimed or cut meanwhile
        lay = cur.layout
        pages: list[tuple[int, int]] = []
        done: list[int] = []
        for w in sorted({self._windows[k] for k in layers}):
            mine = [k for k in layers if self._windows[k] == w and k not in lay.released]
            found = window_pages(lay, w)
            if mine and found:  # rows spanning no whole page are kept
                done += mine
                pages += [(cur.file_offset + a, cur.file_offset + b) for a, b in found]
        if not done:
            return 0
        self._index.replace(dataclasses.replace(cur, layout=lay.release(tuple(done))))
        # The SSD budget and the session count what the file will hold.
        freed = sum(b - a for a, b in pages)
        self._ssd.punch(cur.file_id, cur.file_offset, freed)
        self._sessions.session(cur.session_id).ssd_bytes -= freed
        self._queued.append(WindowRelease(cur.segment_id, cur.file_id, tuple(pages),
                                          tuple(sorted(done))))
        return freed

    def after_recovery(self, files: Iterable[Sequence[tuple[Segment, int]]]) -> None:
        """Restart: each file's re-indexed segments, in file order with their first
        request block, become candidates as they would on publish, along the run of
        segments that continue one another (each starting where the one before it
        ends). Rows punched before the crash came back released (the scan reads the
        holes); rows the books had released before a crash came before the punch are
        candidates again, still counted, as the file still holds them."""
        for segments in files:
            chain: list[HitRun] = []
            for seg, first in segments:
                if chain and chain[-1].prefix_start + chain[-1].num_blocks == first:
                    self.after_publish(seg, chain, first)
                else:
                    chain = []
                chain.append(HitRun(seg, 0, seg.num_blocks, first))

    def give_back(self, releases: Iterable[WindowRelease]) -> None:
        """Releases handed to a data plane that may have stopped before it punched
        them (an engine or attached store whose lease ended): queued again, ahead of
        the others, so the next taker punches them, and the files hold what the SSD
        budget counts without waiting for a restart. Punching a range twice is
        harmless: the books never write a released range again
        (``SsdSpace.truncate_file``). Releases of segments gone meanwhile are dropped
        (their range went with the segment)."""
        live = self._index.has_segment
        back = [r for r in releases if live(r.segment_id) and r not in self._queued]
        self.released_bytes -= sum(r.bytes for r in back)
        self._queued[:0] = back

    def take(self, loads: Mapping[Hashable, LoadPlan]) -> list[WindowRelease]:
        """The queued releases whose segment no restore in flight reads (with the rows:
        it was planned before the release), oldest first; the data plane punches them
        before it drops its lock (a later cut could reuse the range). Releases of
        segments gone meanwhile are dropped."""
        if not self._queued:
            return []
        busy = {run.segment.segment_id for plan in loads.values() for run in plan.hit.runs}
        busy.update(home.segment_id for plan in loads.values() for home, _ in plan.refills)
        # A segment reclaimed or cut meanwhile: its file range may hold new data now.
        live = self._index.has_segment
        self._queued = [r for r in self._queued if live(r.segment_id)]
        out = [r for r in self._queued if r.segment_id not in busy]
        self._queued = [r for r in self._queued if r.segment_id in busy]
        self.released_bytes += sum(r.bytes for r in out)
        return out
