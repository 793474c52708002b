"""Memory copies of SSD-homed segments (FC-GVA, spare host memory). Books only, no I/O.

A block's home is decided once and never moves (``control.placement``). While host memory
has room, the control plane may also keep a *memory copy* of an SSD segment: the same
blocks in the memory layout at an arena offset. A copy is a clean cache line: never
written back, dropped before any memory-homed segment when memory is needed, and
dropped with its home. The home segment, its address and its index entries do not
change; a lookup reports the copy in place of its home (``substitute``), so a restore
reads host memory instead of the SSD.

Copies are dropped one by one, least recently used first (a copy is used when it is
made, whenever a lookup reports it and whenever a restore reads it): dropping one never
cuts a session, its home still serves. A session's dead segments (an agent context
compacted away) so leave memory before the live history of another session does.

Ownership: the ``ControlPlane`` allocates and frees the arena ranges and serialises
every call; this class only keeps ``home segment id -> copy`` in LRU order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from flatcake.control.address import Medium
from flatcake.control.index import BlockIndex, HitRun, PrefixHit, Segment
from flatcake.errors import IntegrityError


class MemoryCopies:
    """``home segment id -> copy segment`` for published copies.

    Invariants (``check_integrity``): every home is a live SSD segment of the index;
    a copy is a memory segment of the same session with the same keys and its own
    segment id.
    """

    def __init__(self) -> None:
        self._by_home: dict[int, Segment] = {}
        self._home_of: dict[int, int] = {}  # copy segment id -> home segment id
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._by_home)

    def __iter__(self) -> Iterator[Segment]:
        """Published copies, least recently used first."""
        return iter(self._by_home.values())

    def homes_lru(self) -> list[int]:
        """Home segment ids of the copies, least recently used first (the order
        copies are dropped in)."""
        return list(self._by_home)

    def touch(self, copy: Segment) -> None:
        """A restore reads ``copy``: it becomes the most recently used."""
        home = self._home_of.get(copy.segment_id)
        if home is not None:
            self._by_home[home] = self._by_home.pop(home)

    def touch_hit(self, hit: PrefixHit) -> None:
        """A lookup found ``hit`` (SSD homes, before ``substitute``): the copies of its
        segments become the most recently used, in prefix order."""
        by_home = self._by_home
        for run in hit.runs:
            home = run.segment.segment_id
            if home in by_home:
                by_home[home] = by_home.pop(home)

    @property
    def total_bytes(self) -> int:
        return self._bytes

    def bytes_of(self, copy_ids: Iterable[int]) -> int:
        """Bytes of the copies held among segment ids ``copy_ids``."""
        return sum(self._by_home[self._home_of[i]].total_bytes for i in copy_ids
                   if i in self._home_of)

    def get(self, home_id: int) -> Segment | None:
        return self._by_home.get(home_id)

    def is_live(self, seg: Segment) -> bool:
        """Whether ``seg`` is a copy still held (not dropped since it was looked up).
        Matched by equality: a hit may come back pickled (an engine attached to the node
        service), and segment ids are never reused."""
        home = self._home_of.get(seg.segment_id)
        return home is not None and self._by_home[home] == seg

    def home_id(self, seg: Segment) -> int:
        """The id of the segment whose blocks ``seg`` holds: its home for a copy, else
        its own."""
        return self._home_of.get(seg.segment_id, seg.segment_id)

    def add(self, home: Segment, copy: Segment) -> None:
        if home.medium != Medium.SSD or copy.medium != Medium.MEMORY or \
                copy.keys != home.keys or copy.session_id != home.session_id:
            raise ValueError(f"segment {copy.segment_id} is not a memory copy of SSD "
                             f"segment {home.segment_id}")
        if home.segment_id in self._by_home:
            raise ValueError(f"SSD segment {home.segment_id} already has a memory copy")
        self._by_home[home.segment_id] = copy
        self._home_of[copy.segment_id] = home.segment_id
        self._bytes += copy.total_bytes

    def pop(self, home_id: int) -> Segment | None:
        """Forget the copy of ``home_id`` (if any) and return it; the caller frees it."""
        copy = self._by_home.pop(home_id, None)
        if copy is not None:
            del self._home_of[copy.segment_id]
            self._bytes -= copy.total_bytes
        return copy

    def substitute(self, hit: PrefixHit) -> PrefixHit:
        """``hit`` with every run of an SSD segment that has a copy read from the copy
        (same positions: the copy holds the same keys in the same order)."""
        if not self._by_home or not hit.num_ssd_blocks:
            return hit
        runs: list[HitRun] = []
        moved = 0
        for run in hit.runs:
            seg, start_pos, count, prefix_start = run
            copy = self._by_home.get(seg.segment_id) if seg.medium == Medium.SSD else None
            if copy is None:
                runs.append(run)
            else:
                runs.append(HitRun(copy, start_pos, count, prefix_start))
                moved += count
        if not moved:
            return hit
        return PrefixHit(hit.num_blocks, hit.num_memory_blocks + moved,
                         hit.num_ssd_blocks - moved, tuple(runs))

    def check_integrity(self, index: BlockIndex) -> None:
        if len(self._home_of) != len(self._by_home) or \
                self._bytes != sum(c.total_bytes for c in self._by_home.values()):
            raise IntegrityError("memory copy books disagree with each other")
        for home_id, copy in self._by_home.items():
            try:
                home = index.segment(home_id)
            except KeyError:
                raise IntegrityError(f"memory copy {copy.segment_id} outlived its home "
                                     f"segment {home_id}") from None
            if home.medium != Medium.SSD or copy.medium != Medium.MEMORY or \
                    copy.keys != home.keys or copy.session_id != home.session_id:
                raise IntegrityError(f"segment {copy.segment_id} is not a memory copy of "
                                     f"segment {home_id}")
            if self._home_of.get(copy.segment_id) != home_id:
                raise IntegrityError(f"memory copy {copy.segment_id} is filed under the "
                                     f"wrong home")
            try:
                index.segment(copy.segment_id)
            except KeyError:
                continue
            raise IntegrityError(f"memory copy {copy.segment_id} is in the index")
