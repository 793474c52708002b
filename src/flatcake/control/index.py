"""The block index (FC-GVA): block key -> (segment, position), kept as *runs*.

A turn's new blocks are written as one ``Segment`` (one contiguous, layer-major range
in a session file or in the host arena), so the index stores each segment once, with
its keys in order, and maps each key to ``(segment, position)``. Layer ``l`` of the
block at position ``j`` lives at ``segment.base_address + layout.block_offset(l, j)``.

A lookup walks *runs*: it looks up the first key of the request, then compares the
rest of the request with the rest of that segment's keys in bulk (tuple slices, C
speed), and only goes back to the hash table where the run ends. Its cost is
O(runs + log) rather than O(blocks), which the replay simulator relies on.

Ownership: the first published segment holding a key owns it. A later segment holding
the same key (two sessions raced to write the same prefix, or a rescan) *shadows* it;
when the owner goes, the oldest shadow takes over, so a key stays findable as long as
any live segment holds its bytes. Single-threaded: the owner of the control plane
serialises calls.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple, cast

from flatcake.control.address import MAX_OFFSET, Medium, address_medium
from flatcake.errors import IntegrityError
from flatcake.layout import ALIGN, SegmentLayout


@dataclass(frozen=True, slots=True)
class Segment:
    """One turn's new blocks of one session, stored contiguously and layer-major.

    Attributes:
        segment_id: unique within the control plane; never reused.
        session_id: the session the segment belongs to (reclaim drops by session).
        medium: ``Medium.MEMORY`` (host arena) or ``Medium.SSD`` (a session file).
        base_address: encoded 64-bit address of the segment's first byte (its header
            on SSD, its layer 0 on memory). Never changes while the segment lives.
        layout: byte layout; ``layout.block_offset(l, j)`` is relative to the base.
        keys: the segment's block keys, in block order (``len == layout.num_blocks``).
        turn_index: the session turn that wrote it (0 = first turn).
        file_id: SSD only: the session file holding the segment.
        file_offset: SSD only: the segment's start inside that file (4 KiB aligned).
    """

    segment_id: int
    session_id: str
    medium: Medium
    base_address: int
    layout: SegmentLayout
    keys: tuple[bytes, ...]
    turn_index: int
    file_id: int | None = None
    file_offset: int | None = None

    def __post_init__(self) -> None:
        if len(self.keys) != self.layout.num_blocks:
            raise ValueError(
                f"Segment.keys has {len(self.keys)} keys but layout.num_blocks="
                f"{self.layout.num_blocks}"
            )
        if address_medium(self.base_address) != self.medium:
            raise ValueError(
                f"Segment.base_address={self.base_address:#x} is not on medium {self.medium!r}"
            )
        if self.offset + self.layout.total_bytes > MAX_OFFSET + 1:
            raise ValueError(f"Segment.base_address={self.base_address:#x}: segment of "
                             f"{self.layout.total_bytes} bytes runs past 2**48")
        if self.turn_index < 0:
            raise ValueError(f"Segment.turn_index must be >= 0, got {self.turn_index!r}")
        if self.medium == Medium.SSD:
            if self.file_id is None or self.file_id < 0:
                raise ValueError(f"Segment.file_id must be >= 0 on SSD, got {self.file_id!r}")
            if self.file_offset is None or self.file_offset < 0 or self.file_offset % ALIGN:
                raise ValueError(
                    f"Segment.file_offset must be a multiple of {ALIGN} on SSD, got "
                    f"{self.file_offset!r}"
                )
        else:
            if self.file_id is not None or self.file_offset is not None:
                raise ValueError(
                    f"Segment.file_id/file_offset must be None in memory, got "
                    f"{self.file_id!r}/{self.file_offset!r}"
                )
            if self.layout.header_bytes:
                raise ValueError(
                    f"Segment.layout.header_bytes must be 0 in memory, got "
                    f"{self.layout.header_bytes}"
                )

    @property
    def num_blocks(self) -> int:
        return self.layout.num_blocks

    @property
    def total_bytes(self) -> int:
        """Bytes the segment occupies (header + data + padding)."""
        return self.layout.total_bytes

    @property
    def offset(self) -> int:
        """The 48-bit offset of the base address in its node's medium space."""
        return self.base_address & MAX_OFFSET

    @property
    def node_id(self) -> int:
        return (self.base_address >> 48) & 0xFFF

    def block_address(self, layer: int, position: int) -> int:
        """Encoded address of layer ``layer`` of the block at ``position``."""
        return self.base_address + self.layout.block_offset(layer, position)


class BlockLocation(NamedTuple):
    """Where one key's block lives: position ``position`` of ``segment``."""

    segment: Segment
    position: int

    def address(self, layer: int) -> int:
        """Encoded address of this block's layer ``layer``."""
        return self.segment.block_address(layer, self.position)


class HitRun(NamedTuple):
    """Request blocks ``[prefix_start, prefix_start + num_blocks)`` are positions
    ``[start_pos, start_pos + num_blocks)`` of ``segment``."""

    segment: Segment
    start_pos: int
    num_blocks: int
    prefix_start: int


new_hit_run = cast(Callable[[tuple[Segment, int, int, int]], HitRun],
                   partial(tuple.__new__, HitRun))
"""``HitRun(*fields)`` at C speed (a NamedTuple's own ``__new__`` is a Python function,
a measurable cost in the lookup's per-run loop)."""


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """The longest prefix of a request's keys that the index holds.

    Attributes:
        num_blocks: length of the hit prefix (blocks ``[0, num_blocks)`` hit).
        num_memory_blocks: how many of them live in host memory.
        num_ssd_blocks: how many of them live on SSD.
        runs: the prefix as runs, in request order, covering ``[0, num_blocks)``
            without gaps or overlaps.
    """

    num_blocks: int
    num_memory_blocks: int
    num_ssd_blocks: int
    runs: tuple[HitRun, ...]

    @property
    def session_ids(self) -> frozenset[str]:
        """Sessions whose segments the hit reads (the ones a restore must pin)."""
        return frozenset(r.segment.session_id for r in self.runs)

    @property
    def needs_ssd(self) -> bool:
        return self.num_ssd_blocks > 0


EMPTY_HIT = PrefixHit(0, 0, 0, ())


def trim_hit(hit: PrefixHit, start: int) -> tuple[HitRun, ...]:
    """The runs of ``hit`` covering request blocks ``[start, hit.num_blocks)`` (a run
    crossing ``start`` is cut there): what a restore reads when the engine already
    holds blocks ``[0, start)``."""
    out: list[HitRun] = []
    # HitRun is a NamedTuple whose ``count`` field is shadowed by ``tuple.count``:
    # unpack it instead of reading the attribute.
    for run in hit.runs:
        seg, start_pos, count, prefix_start = run
        end = prefix_start + count
        if end <= start:
            continue
        if prefix_start >= start:
            out.append(run)
        else:
            cut = start - prefix_start
            out.append(HitRun(seg, start_pos + cut, count - cut, start))
    return tuple(out)


def head_runs(runs: Sequence[HitRun], stop: int) -> tuple[HitRun, ...]:
    """The runs covering request blocks ``[0, stop)`` (a run crossing ``stop`` is cut
    there)."""
    out: list[HitRun] = []
    for run in runs:
        seg, start_pos, count, prefix_start = run
        if prefix_start >= stop:
            break
        out.append(run if prefix_start + count <= stop else
                   HitRun(seg, start_pos, stop - prefix_start, prefix_start))
    return tuple(out)


def _common_run(a: tuple[bytes, ...], ai: int, b: tuple[bytes, ...], bi: int) -> int:
    """Length of the longest common run of ``a[ai:]`` and ``b[bi:]``, given that
    ``a[ai] == b[bi]``. Whole-slice comparisons run at C speed; a mismatch is found by
    bisection over slice comparisons, so the Python work is O(log run)."""
    m = min(len(a) - ai, len(b) - bi)
    if a[ai:ai + m] == b[bi:bi + m]:
        return m
    lo, hi = 1, m  # a[ai:ai+lo] matches, a[ai:ai+hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[ai + lo:ai + mid] == b[bi + lo:bi + mid]:
            lo = mid
        else:
            hi = mid
    return lo


POSITION_BITS = 32  # a key's owner in the index: segment id << 32 | position
_POSITION_MASK = (1 << POSITION_BITS) - 1


class BlockIndex:
    """``key -> BlockLocation`` plus the live segments by id.

    Invariants (``check_integrity``): every key maps to a live segment holding that key
    at that position; every key of every live segment is either owned by it or listed
    among that key's shadows; a segment id is published at most once.
    """

    def __init__(self) -> None:
        # key -> its owner as one int, ``segment_id << POSITION_BITS | position``: a
        # publish builds them in bulk at C speed (one ``range``), with no tuple per
        # block for the garbage collector to track; ``get`` decodes one into a
        # ``BlockLocation``.
        self._loc: dict[bytes, int] = {}
        self._segments: dict[int, Segment] = {}
        # key -> other live locations holding the same key, oldest first (rare).
        self._shadows: dict[bytes, list[tuple[Segment, int]]] = {}

    # -- queries ---------------------------------------------------------------------

    def __len__(self) -> int:
        """Number of distinct keys indexed."""
        return len(self._loc)

    def __contains__(self, key: object) -> bool:
        return key in self._loc

    def _location(self, code: int) -> tuple[Segment, int]:
        return self._segments[code >> POSITION_BITS], code & _POSITION_MASK

    def get(self, key: bytes) -> BlockLocation | None:
        code = self._loc.get(key)
        return None if code is None else BlockLocation(*self._location(code))

    @property
    def num_segments(self) -> int:
        return len(self._segments)

    def has_segment(self, segment_id: int) -> bool:
        return segment_id in self._segments

    def segment_or_none(self, segment_id: int) -> Segment | None:
        return self._segments.get(segment_id)

    def segment(self, segment_id: int) -> Segment:
        try:
            return self._segments[segment_id]
        except KeyError:
            raise KeyError(f"unknown segment_id {segment_id!r}") from None

    def segments(self) -> Iterator[Segment]:
        """Live segments in publication order."""
        return iter(self._segments.values())

    def holders(self, key: bytes) -> list[tuple[Segment, int]]:
        """Every live ``(segment, position)`` holding ``key``: its owner first, then its
        shadows, oldest first."""
        code = self._loc.get(key)
        if code is None:
            return []
        return [self._location(code), *self._shadows.get(key, ())]

    def lookup(self, keys: Sequence[bytes]) -> PrefixHit:
        """The longest prefix of ``keys`` all present, as runs (O(runs) work)."""
        req = keys if isinstance(keys, tuple) else tuple(keys)
        n = len(req)
        loc_get = self._loc.get
        segments = self._segments
        runs: list[HitRun] = []
        mem = ssd = 0
        i = 0
        ssd_medium = Medium.SSD
        new_run = new_hit_run
        while i < n:
            code = loc_get(req[i])
            if code is None:
                break
            seg, j = segments[code >> POSITION_BITS], code & _POSITION_MASK
            skeys = seg.keys
            count = len(skeys) - j
            # Common case first: the rest of the segment is the next stretch of the
            # request (one C-speed slice comparison); else find where they part.
            if not (i + count <= n and req[i:i + count] == (skeys if j == 0 else skeys[j:])):
                count = _common_run(req, i, skeys, j)
            runs.append(new_run((seg, j, count, i)))
            if seg.medium is ssd_medium:
                ssd += count
            else:
                mem += count
            i += count
        if not runs:
            return EMPTY_HIT
        return PrefixHit(i, mem, ssd, tuple(runs))

    # -- updates ---------------------------------------------------------------------

    def publish(self, segment: Segment) -> int:
        """Make ``segment``'s blocks findable. Keys already indexed keep their owner
        (first writer wins) and the new segment becomes a shadow for them.

        Returns the number of keys this segment newly owns.
        """
        sid = segment.segment_id
        if sid in self._segments:
            raise ValueError(f"segment_id {sid!r} is already published")
        loc = self._loc
        keys = segment.keys
        if len(keys) > _POSITION_MASK:
            raise ValueError(f"segment {sid!r} has {len(keys)} blocks, more than the "
                             f"index's {_POSITION_MASK}")
        base = sid << POSITION_BITS
        if loc.keys().isdisjoint(keys):
            # Every key new (a new turn's): a key held twice shows as the index growing
            # by fewer entries than the segment has keys (no set of them built).
            before = len(loc)
            loc.update(zip(keys, range(base, base + len(keys)), strict=False))
            if len(loc) - before == len(keys):
                self._segments[sid] = segment
                return len(keys)
            for key in keys:  # none was indexed before: undo them all
                loc.pop(key, None)
            raise ValueError(f"segment {sid!r} holds the same key twice")
        if len(set(keys)) != len(keys):
            raise ValueError(f"segment {sid!r} holds the same key twice")
        self._segments[sid] = segment
        owned = 0
        for j, key in enumerate(keys):
            if key in loc:
                self._shadows.setdefault(key, []).append((segment, j))
            else:
                loc[key] = base + j
                owned += 1
        return owned

    def replace(self, segment: Segment) -> Segment:
        """Put ``segment`` in the place of the live segment with its id, keys and
        address (its layout changed: window rows released); returns the old one."""
        sid = segment.segment_id
        old = self.segment(sid)
        if (old.keys, old.base_address) != (segment.keys, segment.base_address):
            raise ValueError(f"segment {sid!r}: a replacement must keep its keys and "
                             f"address")
        self._segments[sid] = segment  # the keys it owns name it by its id
        owner = sid << POSITION_BITS
        loc = self._loc
        for j, key in enumerate(segment.keys):
            if loc[key] != owner + j:
                alts = self._shadows[key]
                alts[:] = [(segment, j) if a[0] is old else a for a in alts]
        return old

    def remove_segment(self, segment_id: int) -> Segment:
        """Forget a segment; keys it owned pass to their oldest shadow or disappear."""
        try:
            segment = self._segments.pop(segment_id)
        except KeyError:
            raise KeyError(f"unknown segment_id {segment_id!r}") from None
        loc = self._loc
        shadows = self._shadows
        if not shadows:
            # Every key of a live segment is owned by it or shadows another copy; with
            # no shadows at all, it owns all of them.
            deque(map(loc.__delitem__, segment.keys), 0)
            return segment
        for key in segment.keys:
            owner = loc.get(key)
            if owner is not None and owner >> POSITION_BITS == segment_id:
                alts = shadows.get(key)
                if alts:
                    heir, j = alts.pop(0)
                    loc[key] = (heir.segment_id << POSITION_BITS) + j
                    if not alts:
                        del shadows[key]
                else:
                    del loc[key]
            else:
                alts = shadows.get(key)
                if alts is not None:
                    alts[:] = [a for a in alts if a[0] is not segment]
                    if not alts:
                        del shadows[key]
        return segment

    def check_integrity(self) -> None:
        """Raise ``IntegrityError`` if the books disagree with each other."""
        for key, code in self._loc.items():
            sid, j = code >> POSITION_BITS, code & _POSITION_MASK
            owner = self._segments.get(sid)
            if owner is None:
                raise IntegrityError(f"key {key.hex()[:16]} points at dead segment {sid}")
            if not 0 <= j < owner.num_blocks or owner.keys[j] != key:
                raise IntegrityError(f"key {key.hex()[:16]} points at position {j} of "
                                     f"segment {sid}, which holds another key")
        for key, alts in self._shadows.items():
            if not alts:
                raise IntegrityError(f"empty shadow list for key {key.hex()[:16]}")
            owned = self._loc.get(key)
            if owned is None:
                raise IntegrityError(f"shadowed key {key.hex()[:16]} has no owner")
            for seg, j in alts:
                if self._segments.get(seg.segment_id) is not seg or seg.keys[j] != key:
                    raise IntegrityError(f"bad shadow of key {key.hex()[:16]} in segment "
                                         f"{seg.segment_id}")
                if owned == (seg.segment_id << POSITION_BITS) + j:
                    raise IntegrityError(f"key {key.hex()[:16]} shadows itself")
        held = 0
        for seg in self._segments.values():
            base = seg.segment_id << POSITION_BITS
            for j, key in enumerate(seg.keys):
                held_by = self._loc.get(key)
                if held_by is None:
                    raise IntegrityError(f"key {key.hex()[:16]} of live segment "
                                         f"{seg.segment_id} is not indexed")
                if held_by != base + j:
                    alts = self._shadows.get(key, [])
                    if not any(a[0] is seg and a[1] == j for a in alts):
                        raise IntegrityError(f"key {key.hex()[:16]} at {seg.segment_id}:{j} "
                                             f"is neither owner nor shadow")
            held += seg.num_blocks
        num_shadows = sum(len(a) for a in self._shadows.values())
        if held != len(self._loc) + num_shadows:
            raise IntegrityError(f"{held} held blocks != {len(self._loc)} owned + "
                                 f"{num_shadows} shadows")
