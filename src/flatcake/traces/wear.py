"""The SSD wear a trace implies before any replay (``flatcake analyze``).

A store that writes each block once, when it is first computed (FlatCake's write-time
rule with room for everything), writes every distinct block of the trace once; the
blocks no later request uses again are written and never read. So from the trace's own
block ids:

* ``written_bytes``: distinct blocks x block tokens x the bytes a token costs in the
  layers that keep every block (``KVGeometry.history_block_bytes``: a windowed layer
  keeps a window per turn, not per block);
* ``never_read_bytes``: the share of distinct blocks used only once, of that;
* ``read_bytes``: prefix-hit blocks x block bytes (every hit read from the SSD: an
  upper bound; memory serves part of it);
* ``drive_writes_per_day``: ``written_bytes`` a day of the trace's span (its own
  timestamps, or its requests at ``rate`` req/s) over a drive of ``drive_bytes``.

The replay measures the same four figures for a node with finite memory and SSD
(``replay.node.metrics``).
"""

from __future__ import annotations

from dataclasses import dataclass

from flatcake.geometry import KVGeometry
from flatcake.traces.analyze import TraceStats


@dataclass(frozen=True, slots=True)
class WearEstimate:
    """What writing every distinct block once costs the drive (module docstring)."""

    written_bytes: float
    read_bytes: float
    never_read_bytes: float
    span_s: float | None
    drive_bytes: int
    drive_writes_per_day: float | None

    def line(self) -> str:
        """One line for the report."""
        span = ("no time span (give --rate)" if self.span_s is None else
                f"{self.drive_writes_per_day:.2f} drive-writes/day on a "
                f"{self.drive_bytes / 1e12:g} TB drive over {self.span_s / 3600:.1f} h")
        return (f"writing each block once: {self.written_bytes / 1e9:,.1f} GB written, up to "
                f"{self.read_bytes / 1e9:,.1f} GB read back, "
                f"{self.never_read_bytes / 1e9:,.1f} GB never read; {span}")


def expected_wear(stats: TraceStats, geometry: KVGeometry, drive_bytes: int,
                  rate_req_s: float | None = None) -> WearEstimate | None:
    """The estimate for ``stats`` on ``geometry``; ``None`` for a trace without block
    ids."""
    if stats.unique_blocks is None or stats.block_accesses is None:
        return None
    block_bytes = stats.block_size_tokens * geometry.history_block_bytes \
        / geometry.tokens_per_block
    written = float(stats.unique_blocks) * block_bytes
    never = written * (stats.share_blocks_used_once or 0.0)
    read = float(stats.block_accesses) * (stats.max_prefix_hit_rate or 0.0) * block_bytes
    span = stats.requests / rate_req_s if rate_req_s else stats.time_span_s
    dwpd = written / drive_bytes / (span / 86400.0) if span else None
    return WearEstimate(written, read, never, span or None, drive_bytes, dwpd)
