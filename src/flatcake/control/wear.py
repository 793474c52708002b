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

from flatcake.control.address import Medium
from flatcake.control.index import PrefixHit, Segment


class Wear:
    """The SSD wear counters (see the module docstring)."""

    def __init__(self) -> None:
        self._unread: dict[int, int] = {}  # live SSD segment id -> bytes, never read
        self.written_bytes = 0
        self.read_bytes = 0
        self.dropped_unread_bytes = 0

    @property
    def unread_bytes(self) -> int:
        """Bytes of live SSD segments no restore has read yet."""
        return sum(self._unread.values())

    def wrote(self, seg: Segment) -> None:
        """``seg`` was published; counted when it is an SSD segment."""
        if seg.medium == Medium.SSD:
            self.written_bytes += seg.total_bytes
            self._unread[seg.segment_id] = seg.total_bytes

    def read(self, hit: PrefixHit, ssd_bytes: int) -> None:
        """A restore of ``hit`` read ``ssd_bytes`` from the SSD: the SSD segments it
        read from are read."""
        if not ssd_bytes:
            return
        self.read_bytes += ssd_bytes
        for run in hit.runs:
            if run.segment.medium == Medium.SSD:
                self._unread.pop(run.segment.segment_id, None)

    def dropped(self, segments: Iterable[Segment]) -> None:
        """Reclaim or a cut forgot ``segments``."""
        for seg in segments:
            unread = self._unread.pop(seg.segment_id, None)
            if unread is not None:
                self.dropped_unread_bytes += unread
