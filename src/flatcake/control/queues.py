"""FC-MAS value types and the arrival-ordered ready queue."""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable
from dataclasses import dataclass

from flatcake.config import GIB

PRIORITY_UNIT_BYTES = GIB
"""KV size unit of the priority formula. Only the printed priority depends on it (the
paper quotes sizes in GB: 1 GB waiting 2 s -> 3); the order is the same for any unit."""


@dataclass(frozen=True, slots=True)
class RestoreRequest:
    """A request as the scheduler sees it.

    Attributes:
        request_id: unique among the requests the scheduler holds.
        arrival_time: clock time the request arrived (its place in the ready queue).
        kv_bytes: KV bytes its restore reads from SSD (the priority's denominator).
        needs_ssd: any of its hit blocks lives on SSD (then ``kv_bytes > 0``).
    """

    request_id: Hashable
    arrival_time: float
    kv_bytes: int
    needs_ssd: bool

    def __post_init__(self) -> None:
        if not isinstance(self.arrival_time, int | float) or not math.isfinite(
                self.arrival_time):
            raise ValueError(f"RestoreRequest.arrival_time must be a finite number, got "
                             f"{self.arrival_time!r}")
        if not isinstance(self.kv_bytes, int) or self.kv_bytes < 0:
            raise ValueError(f"RestoreRequest.kv_bytes must be an int >= 0, got "
                             f"{self.kv_bytes!r}")
        if not isinstance(self.needs_ssd, bool):
            raise ValueError(f"RestoreRequest.needs_ssd must be a bool, got "
                             f"{self.needs_ssd!r}")
        if self.needs_ssd and self.kv_bytes == 0:
            raise ValueError(f"RestoreRequest.kv_bytes must be > 0 when needs_ssd, request "
                             f"{self.request_id!r}")


def priority(wait_s: float, kv_bytes: int, unit_bytes: int = PRIORITY_UNIT_BYTES) -> float:
    """``1 + wait_time / kv_size`` with the size in ``unit_bytes`` units."""
    if kv_bytes <= 0:
        raise ValueError(f"kv_bytes must be > 0, got {kv_bytes!r}")
    return 1.0 + max(wait_s, 0.0) / (kv_bytes / unit_bytes)


class ReadyQueue:
    """Requests ready to run, ordered by original arrival time (ties: submission order).

    A restored request re-enters at its arrival position, ahead of every request that
    arrived after it, because its time in the SSD queue counts too.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, RestoreRequest]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, req: RestoreRequest, seq: int) -> None:
        heapq.heappush(self._heap, (req.arrival_time, seq, req))

    def pop(self) -> RestoreRequest | None:
        return heapq.heappop(self._heap)[2] if self._heap else None

    def peek(self) -> RestoreRequest | None:
        return self._heap[0][2] if self._heap else None

    def items(self) -> list[RestoreRequest]:
        """All ready requests in arrival order (does not pop)."""
        return [e[2] for e in sorted(self._heap)]

    def ids(self) -> set[Hashable]:
        return {e[2].request_id for e in self._heap}
