"""SSD wear in the books: bytes written, bytes read back, and bytes written but never read.

One place counts them for every host (the store, the vLLM connector, the node service,
the replay): the control plane calls ``wrote`` when an SSD segment is published,
``read`` when a restore that read SSD segments completes, and ``dropped`` when reclaim
or a cut forgets SSD segments. A segment is *read* once a restore has read any of its
bytes from the SSD (a memory copy serving it does not count: the drive was not read).

* ``written_bytes``: SSD segment bytes written (published).
* ``read_bytes``: SSD bytes restores read (gaps and alignment included).
* ``dropped_unread_bytes``: bytes of SSD segments forgotten before any restore read them.
* ``unread_bytes``: bytes of live SSD segments no restore has read yet.

Written and never read, at any moment, is ``dropped_unread_bytes + unread_bytes``.
Single-threaded, like every verb.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from flatcake.control.address import Medium
from flatcake.control.index import PrefixHit, Segment


class WearCounts(NamedTuple):
    """The four figures now (bytes; see the module docstring)."""

    written_bytes: int
    read_bytes: int
    dropped_unread_bytes: int
    unread_bytes: int


def wear_increments(before: WearCounts, now: WearCounts) -> dict[str, int]:
    """The three counters' growth from ``before`` to ``now``, as
    ``ssd_written_bytes`` / ``ssd_read_bytes`` / ``ssd_dropped_unread_bytes`` (a metrics
    interval's counters; the live unread bytes are a level, not counted)."""
    return {"ssd_written_bytes": now.written_bytes - before.written_bytes,
            "ssd_read_bytes": now.read_bytes - before.read_bytes,
            "ssd_dropped_unread_bytes": now.dropped_unread_bytes
            - before.dropped_unread_bytes}


class Wear:
    """The SSD wear counters (see the module docstring)."""

    def __init__(self) -> None:
        self._unread: dict[int, int] = {}  # live SSD segment id -> bytes, never read
        self.written_bytes = 0
        self.read_bytes = 0
        self.dropped_unread_bytes = 0
        self.unread_bytes = 0  # the sum of ``_unread``

    def counts(self) -> WearCounts:
        return WearCounts(self.written_bytes, self.read_bytes, self.dropped_unread_bytes,
                          self.unread_bytes)

    def wrote(self, seg: Segment) -> None:
        """``seg`` was published; counted when it is an SSD segment."""
        if seg.medium == Medium.SSD:
            self.written_bytes += seg.total_bytes
            self.unread_bytes += seg.total_bytes
            self._unread[seg.segment_id] = seg.total_bytes

    def read(self, hit: PrefixHit, ssd_bytes: int) -> None:
        """A restore of ``hit`` read ``ssd_bytes`` from the SSD: the SSD segments it
        read from are read."""
        if not ssd_bytes:
            return
        self.read_bytes += ssd_bytes
        for run in hit.runs:
            if run.segment.medium == Medium.SSD:
                self.unread_bytes -= self._unread.pop(run.segment.segment_id, 0)

    def dropped(self, segments: Iterable[Segment]) -> None:
        """Reclaim or a cut forgot ``segments``."""
        for seg in segments:
            unread = self._unread.pop(seg.segment_id, None)
            if unread is not None:
                self.dropped_unread_bytes += unread
                self.unread_bytes -= unread
