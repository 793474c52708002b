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

A copy need not be one arena extent (``ArenaCopy``): its blocks may be split, in order,
over several memory segments (*pieces*), each a contiguous run of the home's blocks in
its own extent, so a long turn's copy fits a fragmented arena without dropping other
copies to open one extent. A lookup reports a home run as runs of the pieces it covers;
every reader of memory segments reads pieces as it reads any memory segment.

Ownership: the ``ControlPlane`` allocates and frees the arena ranges and serialises
every call; ``MemoryCopies`` only keeps ``home segment id -> copy`` in LRU order.

Copies written ahead of their segment (``EarlyCopies``): the data plane writes a turn's
memory copy with its segment; once the copy is written (``complete_copy``) lookups and
restores may read it, before the segment is durable::

    prepare_store ─► StorePlan.copy allocated (``spare``)
    complete_copy ─► EarlyCopies.file: every key of the copy -> (plan, position)
                     lookup continues a hit through them (``extend``), piece by
                     piece for a copy split over several extents
    complete_store ─► EarlyCopies.settle: the keys leave; published, the copy serves as
                      a published copy (``MemoryCopies``) or, when the write failed, as
                      the blocks' memory home

The session stays pinned from ``prepare_store`` to ``complete_store``, so an early copy
is never reclaimed. Single-threaded, like every verb.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import repeat
from types import MappingProxyType
from typing import TYPE_CHECKING

from flatcake.control.address import Medium
from flatcake.control.index import BlockIndex, HitRun, PrefixHit, Segment, _common_run
from flatcake.errors import IntegrityError

if TYPE_CHECKING:
    from flatcake.control.types import StorePlan  # types imports this module


@dataclass(frozen=True, slots=True)
class ArenaCopy:
    """The memory copy of one SSD segment: its blocks, in order, in ``pieces``.

    Attributes:
        home_id: the SSD segment whose blocks it holds.
        pieces: memory segments of the home's session, each a contiguous run of the
            home's blocks (in the memory layout, in its own arena extent), in block
            order; together they hold every block of the home exactly once.
    """

    home_id: int
    pieces: tuple[Segment, ...]

    @property
    def session_id(self) -> str:
        return self.pieces[0].session_id

    @property
    def num_blocks(self) -> int:
        return sum(p.num_blocks for p in self.pieces)

    @property
    def total_bytes(self) -> int:
        return sum(p.total_bytes for p in self.pieces)

    @property
    def keys(self) -> tuple[bytes, ...]:
        """The home's keys (the pieces' keys end to end)."""
        if len(self.pieces) == 1:
            return self.pieces[0].keys
        return tuple(k for p in self.pieces for k in p.keys)

    @property
    def segment_ids(self) -> tuple[int, ...]:
        return tuple(p.segment_id for p in self.pieces)

    def starts(self) -> Iterator[tuple[Segment, int]]:
        """Each piece with the home position of its first block."""
        pos = 0
        for piece in self.pieces:
            yield piece, pos
            pos += piece.num_blocks

    def piece_at(self, pos: int) -> tuple[Segment, int]:
        """The piece holding home position ``pos`` and that piece's first position."""
        for piece, start in self.starts():
            if pos < start + piece.num_blocks:
                return piece, start
        raise IndexError(f"position {pos} is past the {self.num_blocks} blocks of the "
                         f"copy of segment {self.home_id}")

    def runs(self, start_pos: int, count: int, prefix_start: int) -> Iterator[HitRun]:
        """Home positions ``[start_pos, start_pos + count)`` (request blocks from
        ``prefix_start``) as runs of the pieces that hold them."""
        end = start_pos + count
        for piece, start in self.starts():
            lo, hi = max(start_pos, start), min(end, start + piece.num_blocks)
            if lo < hi:
                yield HitRun(piece, lo - start, hi - lo, prefix_start + lo - start_pos)


class MemoryCopies:
    """``home segment id -> copy`` for published copies.

    Invariants (``check_integrity``): every home is a live SSD segment of the index;
    a copy's pieces are memory segments of the same session, not in the index, whose
    keys end to end are the home's, each with its own segment id.
    """

    def __init__(self) -> None:
        self._by_home: dict[int, ArenaCopy] = {}
        # Read-only view: a lookup asks nothing of the copies while none is held.
        self.by_home: Mapping[int, ArenaCopy] = MappingProxyType(self._by_home)
        self._home_of: dict[int, int] = {}  # piece segment id -> home segment id
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._by_home)

    def __iter__(self) -> Iterator[ArenaCopy]:
        """Published copies, least recently used first."""
        return iter(self._by_home.values())

    def homes_lru(self) -> list[int]:
        """Home segment ids of the copies, least recently used first (the order
        copies are dropped in)."""
        return list(self._by_home)

    def touch(self, piece: Segment) -> None:
        """A restore reads ``piece`` (of a copy): the copy becomes the most recently
        used."""
        home = self._home_of.get(piece.segment_id)
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

    def bytes_of(self, piece_ids: Iterable[int]) -> int:
        """Bytes of the copies with a piece among segment ids ``piece_ids``."""
        homes = {self._home_of[i] for i in piece_ids if i in self._home_of}
        return sum(self._by_home[h].total_bytes for h in homes)

    def get(self, home_id: int) -> ArenaCopy | None:
        return self._by_home.get(home_id)

    def is_live(self, seg: Segment) -> bool:
        """Whether ``seg`` is a piece of a copy still held (not dropped since it was
        looked up). Matched by equality: a hit may come back pickled (an engine attached
        to the node service), and segment ids are never reused."""
        home = self._home_of.get(seg.segment_id)
        return home is not None and seg in self._by_home[home].pieces

    def home_id(self, seg: Segment) -> int:
        """The id of the segment whose blocks ``seg`` holds: its home for a piece of a
        copy, else its own."""
        return self._home_of.get(seg.segment_id, seg.segment_id)

    def add(self, home: Segment, copy: ArenaCopy) -> None:
        if not is_copy_of(copy, home):
            raise ValueError(f"segments {list(copy.segment_ids)} are not a memory copy of "
                             f"SSD segment {home.segment_id}")
        if home.segment_id in self._by_home:
            raise ValueError(f"SSD segment {home.segment_id} already has a memory copy")
        self._by_home[home.segment_id] = copy
        for piece in copy.pieces:
            self._home_of[piece.segment_id] = home.segment_id
        self._bytes += copy.total_bytes

    def pop(self, home_id: int) -> ArenaCopy | None:
        """Forget the copy of ``home_id`` (if any) and return it; the caller frees its
        pieces."""
        copy = self._by_home.pop(home_id, None)
        if copy is not None:
            for piece in copy.pieces:
                del self._home_of[piece.segment_id]
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
            elif len(copy.pieces) == 1:
                runs.append(HitRun(copy.pieces[0], start_pos, count, prefix_start))
                moved += count
            else:
                runs.extend(copy.runs(start_pos, count, prefix_start))
                moved += count
        if not moved:
            return hit
        return PrefixHit(hit.num_blocks, hit.num_memory_blocks + moved,
                         hit.num_ssd_blocks - moved, tuple(runs))

    def check_integrity(self, index: BlockIndex) -> None:
        if len(self._home_of) != sum(len(c.pieces) for c in self._by_home.values()) or \
                self._bytes != sum(c.total_bytes for c in self._by_home.values()):
            raise IntegrityError("memory copy books disagree with each other")
        for home_id, copy in self._by_home.items():
            ids = list(copy.segment_ids)
            try:
                home = index.segment(home_id)
            except KeyError:
                raise IntegrityError(f"memory copy {ids} outlived its home segment "
                                     f"{home_id}") from None
            if copy.home_id != home_id or not is_copy_of(copy, home):
                raise IntegrityError(f"segments {ids} are not a memory copy of segment "
                                     f"{home_id}")
            for piece in copy.pieces:
                if self._home_of.get(piece.segment_id) != home_id:
                    raise IntegrityError(f"memory copy piece {piece.segment_id} is filed "
                                         f"under the wrong home")
                if index.has_segment(piece.segment_id):
                    raise IntegrityError(f"memory copy piece {piece.segment_id} is in the "
                                         f"index")


def is_copy_of(copy: ArenaCopy, home: Segment) -> bool:
    """Whether ``copy`` holds the blocks of SSD segment ``home``: memory pieces of its
    session whose keys end to end are its keys, no piece empty."""
    return home.medium == Medium.SSD and copy.home_id == home.segment_id and \
        bool(copy.pieces) and all(
            p.medium == Medium.MEMORY and p.session_id == home.session_id and p.num_blocks
            for p in copy.pieces) and copy.keys == home.keys


class EarlyCopies:
    """The copies written ahead of their segments, by key.

    Owns (written only by its methods, called from the store verbs): ``_early``, key ->
    (the store in flight whose memory copy holds it, its position in that copy);
    ``_ids``, their home segment ids -> whether the copy owns every entry of its keys;
    and ``_pieces``, the segment ids of those copies' pieces.
    """

    def __init__(self) -> None:
        self._early: dict[bytes, tuple[StorePlan, int]] = {}
        # Read-only view: a lookup asks nothing here while no copy is written early.
        self.by_key: Mapping[bytes, tuple[StorePlan, int]] = MappingProxyType(self._early)
        self._ids: dict[int, bool] = {}
        self._pieces: set[int] = set()

    def holds(self, piece_segment_id: int) -> bool:
        """Whether the copy piece ``piece_segment_id`` serves early (written, segment
        in flight)."""
        return piece_segment_id in self._pieces

    def file(self, plan: StorePlan, copy: ArenaCopy) -> None:
        """``copy`` (``plan.copy``) is written: lookups may use it from now on."""
        # Every key, not just the first: the index may already hold the copy's first
        # blocks (another copy of them became their memory home), and the lookup
        # continues into this copy at the first key it lacks.
        early = self._early
        keys = copy.keys
        # A copy's keys never repeat (prepare_store checks them): when none is taken
        # yet, one C-speed update files them all and the copy owns every entry.
        whole = early.keys().isdisjoint(keys)
        if whole:
            early.update(zip(keys, zip(repeat(plan), range(len(keys))), strict=False))
        else:
            for j, key in enumerate(keys):
                early.setdefault(key, (plan, j))
        self._ids[copy.home_id] = whole
        self._pieces.update(copy.segment_ids)

    def settle(self, plan: StorePlan) -> bool:
        """``plan``'s store completed: its keys leave. Returns whether its copy was
        written early (restores may be reading it)."""
        copy = plan.copy
        if copy is None or copy.home_id not in self._ids:
            return False
        self._pieces.difference_update(copy.segment_ids)
        if self._ids.pop(copy.home_id):
            # It owns every entry of its keys (only its own store removes them).
            deque(map(self._early.__delitem__, copy.keys), maxlen=0)
        else:
            for key in copy.keys:
                entry = self._early.get(key)
                if entry is not None and entry[0].segment.segment_id == plan.segment.segment_id:
                    del self._early[key]
        return True

    def extend(self, req: tuple[bytes, ...], hit: PrefixHit) -> PrefixHit:
        """``hit`` continued through copies written ahead of their segments."""
        if not self._early:
            return hit
        runs = list(hit.runs)
        pos, mem = hit.num_blocks, hit.num_memory_blocks
        while pos < len(req):
            entry = self._early.get(req[pos])
            if entry is None or entry[0].copy is None:
                break
            copy, j = entry[0].copy, entry[1]
            # The piece holding position j; the next key, if it follows on, is filed
            # under the next piece (or another copy).
            piece, start = copy.piece_at(j) if len(copy.pieces) > 1 else (copy.pieces[0], 0)
            count = _common_run(req, pos, piece.keys, j - start)
            runs.append(HitRun(piece, j - start, count, pos))
            pos += count
            mem += count
            if j - start + count < piece.num_blocks:
                break
        if pos == hit.num_blocks:
            return hit
        return PrefixHit(pos, mem, hit.num_ssd_blocks, tuple(runs))
