"""Address allocation (FC-GVA), host side: the host-memory arena.

Enforces a hard byte budget at allocation time; nothing here touches memory. The SSD
side (a node's SSD virtual space of session files) is ``ssd_space``.

Host arena: offsets ``[0, capacity_bytes)`` of one host buffer owned by the data plane.
Best-fit extent allocator (smallest free extent that fits, lowest offset on ties) with
coalescing on free; sizes are rounded up to ``align``.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Mapping

from flatcake.errors import CapacityError, IntegrityError
from flatcake.layout import ALIGN, align_up


class HostArena:
    """Best-fit extent allocator over ``[0, capacity_bytes)``.

    Invariants (``check_integrity``): free extents are disjoint, sorted, coalesced (no
    two touch) and never overlap an allocation; free + allocated bytes == usable bytes.
    """

    def __init__(self, capacity_bytes: int, align: int = ALIGN) -> None:
        if not isinstance(capacity_bytes, int) or capacity_bytes < 0:
            raise ValueError(f"HostArena.capacity_bytes must be an int >= 0, got "
                             f"{capacity_bytes!r}")
        if align <= 0:
            raise ValueError(f"HostArena.align must be > 0, got {align!r}")
        self.capacity_bytes = capacity_bytes
        self.align = align
        self._usable = capacity_bytes // align * align
        self._allocated: dict[int, int] = {}  # offset -> size
        self._used = 0
        self._free_end: dict[int, int] = {}  # free extent start -> end
        self._free_starts: list[int] = []  # sorted starts
        self._by_size: list[tuple[int, int]] = []  # sorted (size, start)
        if self._usable:
            self._add_free(0, self._usable)

    # -- free-list plumbing ----------------------------------------------------------

    def _add_free(self, start: int, end: int) -> None:
        self._free_end[start] = end
        bisect.insort(self._free_starts, start)
        bisect.insort(self._by_size, (end - start, start))

    def _remove_free(self, start: int) -> int:
        end = self._free_end.pop(start)
        del self._free_starts[bisect.bisect_left(self._free_starts, start)]
        del self._by_size[bisect.bisect_left(self._by_size, (end - start, start))]
        return end

    # -- queries ---------------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def free_bytes(self) -> int:
        return self._usable - self._used

    @property
    def largest_free_bytes(self) -> int:
        return self._by_size[-1][0] if self._by_size else 0

    @property
    def num_allocations(self) -> int:
        return len(self._allocated)

    def size_of(self, offset: int) -> int:
        try:
            return self._allocated[offset]
        except KeyError:
            raise KeyError(f"no arena allocation at offset {offset!r}") from None

    def can_fit(self, size_bytes: int) -> bool:
        """Whether ``try_alloc(size_bytes)`` would succeed now."""
        return align_up(size_bytes, self.align) <= self.largest_free_bytes

    def cheapest_window(self, size_bytes: int,
                        movable: Collection[int] | Mapping[int, int]) -> list[int] | None:
        """The allocations to free so that ``size_bytes`` fit in one extent: the offsets
        (all in ``movable``) inside the cheapest run of free extents and ``movable``
        allocations, in address order, that spans ``size_bytes``; ``[]`` when it fits
        now, ``None`` when no such run exists. A run costs the sum of its allocations'
        prices: ``movable[offset]`` (an int >= 0) when ``movable`` is a mapping, else
        their bytes (fewest bytes first)."""
        size = align_up(size_bytes, self.align)
        if size <= self.largest_free_bytes:
            return []
        prices = movable if isinstance(movable, Mapping) else None
        extents = sorted([(s, e - s, -1) for s, e in self._free_end.items()]
                         + [(o, n, n if prices is None else prices[o])
                            for o, n in self._allocated.items() if o in movable])
        best: tuple[int, int, int] | None = None  # (cost, first, last) extent indices
        first = span = cost = 0
        for last, (start, length, price) in enumerate(extents):
            if last > first and extents[last - 1][0] + extents[last - 1][1] != start:
                first, span, cost = last, 0, 0  # an unmovable allocation between
            span += length
            cost += max(price, 0)
            while span - extents[first][1] >= size:
                span -= extents[first][1]
                cost -= max(extents[first][2], 0)
                first += 1
            if span >= size and (best is None or cost < best[0]):
                best = (cost, first, last)
        if best is None:
            return None
        return [o for o, _n, price in extents[best[1]:best[2] + 1] if price >= 0]

    # -- updates ---------------------------------------------------------------------

    def try_alloc(self, size_bytes: int) -> int | None:
        """Offset of a new allocation of ``size_bytes`` (rounded up to ``align``), or
        ``None`` when no free extent is large enough."""
        if not isinstance(size_bytes, int) or size_bytes <= 0:
            raise ValueError(f"HostArena.try_alloc size_bytes must be an int > 0, got "
                             f"{size_bytes!r}")
        size = align_up(size_bytes, self.align)
        i = bisect.bisect_left(self._by_size, (size, -1))
        if i == len(self._by_size):
            return None
        start = self._by_size[i][1]
        end = self._remove_free(start)
        if start + size < end:
            self._add_free(start + size, end)
        self._allocated[start] = size
        self._used += size
        return start

    def alloc(self, size_bytes: int) -> int:
        """Like ``try_alloc`` but raises ``CapacityError`` when it cannot fit."""
        offset = self.try_alloc(size_bytes)
        if offset is None:
            raise CapacityError(
                f"host arena cannot fit {size_bytes} bytes: used {self._used} of "
                f"{self.capacity_bytes}, largest free extent {self.largest_free_bytes}"
            )
        return offset

    def free(self, offset: int) -> int:
        """Free the allocation at ``offset``; returns its (aligned) size."""
        try:
            size = self._allocated.pop(offset)
        except KeyError:
            raise KeyError(f"no arena allocation at offset {offset!r}") from None
        self._used -= size
        start, end = offset, offset + size
        i = bisect.bisect_left(self._free_starts, start)
        if i > 0:
            prev = self._free_starts[i - 1]
            if self._free_end[prev] == start:
                self._remove_free(prev)
                start = prev
        if end in self._free_end:
            end = self._remove_free(end)
        self._add_free(start, end)
        return size

    def check_integrity(self) -> None:
        starts = sorted(self._free_end)
        if starts != self._free_starts:
            raise IntegrityError("arena free-start list out of sync")
        if sorted((e - s, s) for s, e in self._free_end.items()) != self._by_size:
            raise IntegrityError("arena size index out of sync")
        extents = sorted([(s, e, "free") for s, e in self._free_end.items()]
                         + [(o, o + n, "used") for o, n in self._allocated.items()])
        pos = 0
        prev_kind = ""
        for s, e, kind in extents:
            if s != pos:
                raise IntegrityError(f"arena gap or overlap at {pos}..{s}")
            if e <= s:
                raise IntegrityError(f"arena empty extent at {s}")
            if kind == "free" and prev_kind == "free":
                raise IntegrityError(f"arena free extents not coalesced at {s}")
            pos, prev_kind = e, kind
        if pos != self._usable:
            raise IntegrityError(f"arena extents end at {pos}, not {self._usable}")
        if self._used != sum(self._allocated.values()):
            raise IntegrityError("arena used bytes out of sync")
