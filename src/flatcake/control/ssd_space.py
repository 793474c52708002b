"""Address allocation (FC-GVA), SSD side: a node's SSD virtual space of session files.

Enforces a hard byte budget at allocation time; nothing here touches disk.

SSD virtual space of one node (48-bit offsets)::

    0            S            2S           3S                          2**48
    +------------+------------+------------+---- ... ----+
    | span 0     | span 1     | span 2     |             |   S = session_file_bytes
    | file 7     | (free)     | file 9     |             |
    +------------+------------+------------+---- ... ----+
      |hdr|seg0|seg1|...           <- one session file, appended in order

Each session file is mapped at a fixed span when it is created, so the address of a
block never changes and ``offset -> (file_id, file_offset)`` is a range lookup. A
session's segments append inside its current file; one that does not fit opens a new
file (new ``file_id``, new span). Freed spans are reused lowest first; file ids never
are. The SSD budget counts file headers plus allocated segment bytes. A file can be cut
(``truncate_file``) at a damaged segment: its tail is given back and appends resume
after the last good segment, unless the tail held released window rows: then the file
is sealed and the session's next segment opens a new file. A release handed to one
engine's workers may still be punched after another engine's workers ran the cut, so
no byte of a released range is ever written again.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field

from flatcake.control.address import MAX_OFFSET
from flatcake.errors import CapacityError, IntegrityError
from flatcake.layout import ALIGN, align_up


@dataclass(slots=True)
class SessionFile:
    """Books of one session file (mutable; owned by ``SsdSpace``).

    Attributes:
        file_id: names the file (``cio.format.session_file_name``).
        session_id: owner session.
        base_offset: where the file's span starts in the node's SSD virtual space.
        span_bytes: the span's size; the file never grows past it.
        end_bytes: append pointer (file header + segments, including holes).
        extents: live segment allocations, ``file_offset -> size_bytes``.
        punched: bytes of an extent punched out of the file (released window rows),
            ``file_offset -> bytes``: the file no longer holds them.
        sealed: a cut gave back an extent with released rows: no more appends (a
            punch of them may still be on its way), the session's next segment opens
            a new file.
    """

    file_id: int
    session_id: str
    base_offset: int
    span_bytes: int
    end_bytes: int
    extents: dict[int, int] = field(default_factory=dict)
    punched: dict[int, int] = field(default_factory=dict)
    sealed: bool = False

    @property
    def allocated_bytes(self) -> int:
        """What the file's segments hold on disk (extents less their punched pages)."""
        return sum(self.extents.values()) - sum(self.punched.values())


@dataclass(frozen=True, slots=True)
class SsdExtent:
    """A segment's place on SSD.

    Attributes:
        file_id: the session file.
        file_offset: where the segment starts in the file (4 KiB aligned).
        size_bytes: the segment's size (4 KiB multiple).
        base_offset: the file's base in the node's SSD virtual space.
        new_file: the file was opened for this extent; the data plane creates it.
    """

    file_id: int
    file_offset: int
    size_bytes: int
    base_offset: int
    new_file: bool

    @property
    def offset(self) -> int:
        """The segment's offset in the node's SSD virtual space."""
        return self.base_offset + self.file_offset


class SsdSpace:
    """One node's SSD virtual space: session files mapped at fixed spans, appended.

    Invariants (``check_integrity``): live files sit at distinct span-aligned bases;
    extents of a file are disjoint, 4 KiB aligned and inside ``[file_header_bytes,
    end_bytes)``; ``used_bytes`` = file headers + extents - their punched pages (what
    the files hold: released window rows no longer count against the budget).
    """

    def __init__(self, node_id: int, capacity_bytes: int, session_file_bytes: int,
                 file_header_bytes: int = ALIGN) -> None:
        if not isinstance(capacity_bytes, int) or capacity_bytes < 0:
            raise ValueError(f"SsdSpace.capacity_bytes must be an int >= 0, got "
                             f"{capacity_bytes!r}")
        if session_file_bytes <= 0 or session_file_bytes % ALIGN:
            raise ValueError(f"SsdSpace.session_file_bytes must be a positive multiple of "
                             f"{ALIGN}, got {session_file_bytes!r}")
        if file_header_bytes < 0 or file_header_bytes % ALIGN or \
                file_header_bytes >= session_file_bytes:
            raise ValueError(f"SsdSpace.file_header_bytes must be a multiple of {ALIGN} "
                             f"below session_file_bytes, got {file_header_bytes!r}")
        self.node_id = node_id
        self.capacity_bytes = capacity_bytes
        self.span_bytes = session_file_bytes
        self.file_header_bytes = file_header_bytes
        self.num_spans = (MAX_OFFSET + 1) // session_file_bytes
        self._used = 0
        self._files: dict[int, SessionFile] = {}
        self._by_session: dict[str, list[int]] = {}  # session -> file ids, oldest first
        self._bases: list[int] = []  # sorted live bases
        self._file_at_base: dict[int, int] = {}
        self._free_spans: list[int] = []  # heap of freed span indices
        self._next_span = 0
        self._next_file_id = 0

    # -- queries ---------------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def num_files(self) -> int:
        return len(self._files)

    def file(self, file_id: int) -> SessionFile:
        try:
            return self._files[file_id]
        except KeyError:
            raise KeyError(f"unknown file_id {file_id!r}") from None

    def files_of(self, session_id: str) -> list[int]:
        """File ids of a session, oldest first (empty if it has none)."""
        return list(self._by_session.get(session_id, ()))

    def can_fit(self, size_bytes: int, new_file: bool = True) -> bool:
        """Whether the budget can take ``size_bytes`` more (plus a file header)."""
        extra = self.file_header_bytes if new_file else 0
        return self._used + align_up(size_bytes) + extra <= self.capacity_bytes

    @property
    def free_spans(self) -> int:
        """Spans a new session file may still take (freed ones plus never used)."""
        return len(self._free_spans) + self.num_spans - self._next_span

    @property
    def spans_in_use(self) -> int:
        """Spans mapped to live session files (one each)."""
        return self.num_spans - self.free_spans

    def opens_file(self, session_id: str, size_bytes: int) -> bool:
        """Whether ``try_allocate(session_id, size_bytes)`` would open a new file (and
        so take a span)."""
        ids = self._by_session.get(session_id)
        if not ids:
            return True
        f = self._files[ids[-1]]
        return f.sealed or f.end_bytes + align_up(size_bytes) > f.span_bytes

    def resolve(self, offset: int) -> tuple[int, int]:
        """``(file_id, file_offset)`` of a virtual SSD offset (bisect over live bases)."""
        i = bisect.bisect_right(self._bases, offset) - 1
        if i >= 0:
            base = self._bases[i]
            if offset < base + self.span_bytes:
                return self._file_at_base[base], offset - base
        raise KeyError(f"SSD offset {offset:#x} is not inside any live session file")

    # -- span plumbing ---------------------------------------------------------------

    def _take_span(self) -> int:
        if self._free_spans:
            return heapq.heappop(self._free_spans)
        if self._next_span >= self.num_spans:
            raise CapacityError(f"SSD virtual space of node {self.node_id} has no free span "
                                f"of {self.span_bytes} bytes ({self.num_spans} in use)")
        self._next_span += 1
        return self._next_span - 1

    def _map_file(self, session_id: str, file_id: int, span: int) -> SessionFile:
        base = span * self.span_bytes
        f = SessionFile(file_id, session_id, base, self.span_bytes, self.file_header_bytes)
        self._files[file_id] = f
        self._by_session.setdefault(session_id, []).append(file_id)
        bisect.insort(self._bases, base)
        self._file_at_base[base] = file_id
        self._used += self.file_header_bytes
        self._next_file_id = max(self._next_file_id, file_id + 1)
        return f

    # -- updates ---------------------------------------------------------------------

    def try_allocate(self, session_id: str, size_bytes: int) -> SsdExtent | None:
        """Append ``size_bytes`` to the session's current file, or open a new file when
        it does not fit there. ``None`` when the SSD budget cannot take it or a new file
        finds no free span (``free_spans``: the caller reclaims sessions first); raises
        ``CapacityError`` when one segment is larger than a whole span (a config
        error)."""
        if not isinstance(size_bytes, int) or size_bytes <= 0:
            raise ValueError(f"SsdSpace.try_allocate size_bytes must be an int > 0, got "
                             f"{size_bytes!r}")
        size = align_up(size_bytes)
        if size > self.span_bytes - self.file_header_bytes:
            raise CapacityError(
                f"a segment of {size} bytes does not fit in one session file span "
                f"(store.session_file_bytes={self.span_bytes})"
            )
        if not self.opens_file(session_id, size):
            if self._used + size > self.capacity_bytes:
                return None
            f, new_file = self._files[self._by_session[session_id][-1]], False
        else:
            if self._used + size + self.file_header_bytes > self.capacity_bytes or \
                    not self.free_spans:
                return None
            f = self._map_file(session_id, self._next_file_id, self._take_span())
            new_file = True
        file_offset = f.end_bytes
        f.extents[file_offset] = size
        f.end_bytes += size
        self._used += size
        return SsdExtent(f.file_id, file_offset, size, f.base_offset, new_file)

    def allocate(self, session_id: str, size_bytes: int) -> SsdExtent:
        """Like ``try_allocate`` but raises ``CapacityError`` when the budget is short."""
        ext = self.try_allocate(session_id, size_bytes)
        if ext is None:
            raise CapacityError(
                f"SSD budget cannot fit {size_bytes} bytes: used {self._used} of "
                f"store.ssd_capacity_bytes={self.capacity_bytes}"
            )
        return ext

    def free_extent(self, file_id: int, file_offset: int) -> int:
        """Give back one extent (a write that failed). The file's append pointer rolls
        back when the extent was its tail; otherwise a hole stays until the file goes.
        Returns the bytes given back to the budget."""
        f = self.file(file_id)
        try:
            size = f.extents.pop(file_offset)
        except KeyError:
            raise KeyError(f"file {file_id} has no extent at offset {file_offset!r}") from None
        held = size - f.punched.pop(file_offset, 0)
        self._used -= held
        if file_offset + size == f.end_bytes:
            f.end_bytes = max((o + n for o, n in f.extents.items()),
                              default=self.file_header_bytes)
        return held

    def truncate_file(self, file_id: int, file_offset: int) -> int:
        """Cut a file at ``file_offset`` (a damaged segment's start): every extent from
        there on is given back, and the append pointer rolls back to the end of the last
        extent left (or the file header), so the next append lands right after the last
        good segment; when an extent given back had released rows the file is sealed
        instead (a punch of them may not have run yet). ``file_offset`` must not fall
        inside an extent. Returns the bytes given back to the budget (the file itself
        stays mapped)."""
        f = self.file(file_id)
        if file_offset < self.file_header_bytes or file_offset % ALIGN:
            raise ValueError(f"file_offset={file_offset!r} is not a 4 KiB aligned offset in "
                             f"file {file_id}'s segment area")
        freed = 0
        for o in [o for o in f.extents if o + f.extents[o] > file_offset]:
            if o < file_offset:
                raise ValueError(f"file_offset={file_offset!r} falls inside the extent at "
                                 f"{o} of file {file_id}")
            punched = f.punched.pop(o, 0)
            f.sealed = f.sealed or punched > 0
            freed += f.extents.pop(o) - punched
        self._used -= freed
        f.end_bytes = max((o + n for o, n in f.extents.items()),
                          default=self.file_header_bytes)
        return freed

    def release_file(self, file_id: int) -> int:
        """Unmap a file (its span becomes free); returns the bytes given back."""
        f = self._files.pop(file_id, None)
        if f is None:
            raise KeyError(f"unknown file_id {file_id!r}")
        freed = self.file_header_bytes + f.allocated_bytes
        self._used -= freed
        ids = self._by_session[f.session_id]
        ids.remove(file_id)
        if not ids:
            del self._by_session[f.session_id]
        del self._bases[bisect.bisect_left(self._bases, f.base_offset)]
        del self._file_at_base[f.base_offset]
        heapq.heappush(self._free_spans, f.base_offset // self.span_bytes)
        return freed

    def punch(self, file_id: int, file_offset: int, nbytes: int) -> None:
        """``nbytes`` of the extent at ``file_offset`` were punched out of the file
        (released window rows): the budget stops counting them."""
        f = self.file(file_id)
        size = f.extents.get(file_offset)
        done = f.punched.get(file_offset, 0) + nbytes
        if size is None or nbytes < 0 or done > size:
            raise ValueError(f"cannot punch {nbytes} B of file {file_id} at "
                             f"{file_offset!r}: extent {size!r}, punched already "
                             f"{f.punched.get(file_offset, 0)}")
        f.punched[file_offset] = done
        self._used -= nbytes

    def release_session(self, session_id: str) -> list[int]:
        """Unmap every file of a session; returns their ids."""
        ids = self.files_of(session_id)
        for file_id in ids:
            self.release_file(file_id)
        return ids

    def reserve_file_id(self, file_id: int) -> None:
        """Restart: a file with this id exists on disk (served, empty or quarantined),
        so no new file may take it."""
        self._next_file_id = max(self._next_file_id, file_id + 1)

    def adopt_extent(self, session_id: str, file_id: int, file_offset: int, size_bytes: int,
                     base_offset: int | None = None) -> SsdExtent:
        """Restart recovery: record a segment found in an existing file.

        The file is mapped on first sight, at ``base_offset`` when given (the base
        recorded in its header, if that span is free) else at a fresh span. The budget
        is charged even past capacity (the bytes are on disk); reclaim brings it down.
        """
        size = align_up(size_bytes)
        f = self._files.get(file_id)
        if f is None:
            span = self._adopt_span(base_offset)
            f = self._map_file(session_id, file_id, span)
        elif f.session_id != session_id:
            raise ValueError(f"file_id {file_id} belongs to session {f.session_id!r}, "
                             f"not {session_id!r}")
        if file_offset < self.file_header_bytes or file_offset % ALIGN or \
                file_offset + size > f.span_bytes:
            raise ValueError(f"file_offset={file_offset!r} (size {size}) is outside file "
                             f"{file_id}'s segment area [{self.file_header_bytes}, "
                             f"{f.span_bytes})")
        for o, n in f.extents.items():
            if o < file_offset + size and file_offset < o + n:
                raise ValueError(f"file_offset={file_offset!r} overlaps the segment at {o} "
                                 f"of file {file_id}")
        f.extents[file_offset] = size
        f.end_bytes = max(f.end_bytes, file_offset + size)
        self._used += size
        # The newest file of a session is the one appends go to.
        ids = self._by_session[session_id]
        ids.sort()
        return SsdExtent(file_id, file_offset, size, f.base_offset, False)

    def _adopt_span(self, base_offset: int | None) -> int:
        if base_offset is not None and base_offset % self.span_bytes == 0 and \
                0 <= base_offset // self.span_bytes < self.num_spans and \
                base_offset not in self._file_at_base:
            span = base_offset // self.span_bytes
            if span >= self._next_span:
                for s in range(self._next_span, span):
                    heapq.heappush(self._free_spans, s)
                self._next_span = span + 1
                return span
            if span in self._free_spans:
                self._free_spans.remove(span)
                heapq.heapify(self._free_spans)
                return span
        return self._take_span()

    def check_integrity(self) -> None:
        used = 0
        if sorted(self._file_at_base) != self._bases:
            raise IntegrityError("SSD base list out of sync")
        for file_id, f in self._files.items():
            if self._file_at_base.get(f.base_offset) != file_id:
                raise IntegrityError(f"file {file_id} not mapped at its base")
            if f.base_offset % self.span_bytes:
                raise IntegrityError(f"file {file_id} base not span aligned")
            if file_id not in self._by_session.get(f.session_id, ()):
                raise IntegrityError(f"file {file_id} missing from its session's list")
            if file_id >= self._next_file_id:
                raise IntegrityError(f"file id {file_id} >= next id {self._next_file_id}")
            pos = self.file_header_bytes
            for o in sorted(f.extents):
                n = f.extents[o]
                if o < pos or o % ALIGN or n % ALIGN or n <= 0:
                    raise IntegrityError(f"file {file_id} extent {o}+{n} misplaced")
                pos = o + n
            if any(f.extents.get(o, -1) < n for o, n in f.punched.items()):
                raise IntegrityError(f"file {file_id} punched pages outside its extents")
            if pos > f.end_bytes or f.end_bytes > f.span_bytes:
                raise IntegrityError(f"file {file_id} append pointer {f.end_bytes} wrong")
            used += self.file_header_bytes + f.allocated_bytes
        if used != self._used:
            raise IntegrityError(f"SSD used bytes {self._used} != books {used}")
        if sum(len(v) for v in self._by_session.values()) != len(self._files):
            raise IntegrityError("SSD session file lists out of sync")
        spans = set(self._free_spans) | {b // self.span_bytes for b in self._bases}
        if len(spans) != len(self._free_spans) + len(self._bases) or \
                spans != set(range(self._next_span)):
            raise IntegrityError("SSD spans leaked or double-booked")
