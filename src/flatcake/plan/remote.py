"""Remote runs: blocks another node holds, described for the executor's remote readers.

Pure: no I/O. The owner publishes each durable segment with a *segment record*
(``segment_record``): its base address (medium and owner node in its bits), its layout,
where its bytes are on the owner (the session file's name and offset on SSD; the arena
offset is the address's offset in memory) and the crc32 of each whole layer. A requester
turns the cluster index's hits (one per block key, in request order) into ``RemoteRun``s
(``remote_runs``): consecutive positions of one segment of one node, in request order,
starting right after the local prefix. A remote reader reads whole segment layers (the
crc32 covers a whole layer), so the requester verifies every layer before a block of it
is used.

A node of several tensor-parallel parts (the node service, heads split over the ranks)
publishes one record per segment with the crc32s of every part (``parts``): part ``p``'s
bytes lie at the same offsets of the same-named file (and arena offset) of the owner's
part ``p``, and a requester's rank reads and verifies its own part (``RemoteRun.of_part``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from flatcake.control.address import Address, Medium
from flatcake.control.index import Segment
from flatcake.layout import SegmentLayout


@dataclass(frozen=True, slots=True)
class RemoteRun:
    """Request blocks ``[request_start, request_start + count)`` are positions
    ``[start_pos, start_pos + count)`` of a segment another node holds.

    Attributes:
        address: the segment's base address: its medium and node pick the reader
            (``ReaderDispatch``), its offset is the arena offset of layer 0 in memory.
        layout: the segment's byte layout (``layout.layer_offset(l)`` from the base).
        location: SSD: the owner's session file name; memory: ``""``.
        file_offset: SSD: the segment's start in that file; memory: 0.
        crcs: crc32 of each whole layer of the segment (``layout.layer_bytes`` each);
            part 0's when the owner keeps several parts.
        parts: crc32s of every part (``crcs`` is ``parts[0]``) when the owner keeps
            several; () for one.
    """

    address: int
    request_start: int
    start_pos: int
    count: int
    layout: SegmentLayout
    location: str
    file_offset: int
    crcs: tuple[int, ...]
    parts: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.count <= 0 or self.start_pos < 0 or \
                self.start_pos + self.count > self.layout.num_blocks:
            raise ValueError(f"remote run: positions [{self.start_pos}, "
                             f"{self.start_pos + self.count}) outside a segment of "
                             f"{self.layout.num_blocks} blocks")
        if len(self.crcs) != self.layout.num_layers:
            raise ValueError(f"remote run: {len(self.crcs)} crcs for "
                             f"{self.layout.num_layers} layers")
        if self.medium == Medium.SSD and not self.location:
            raise ValueError("remote run on SSD without the owner's file name")
        if any(len(c) != self.layout.num_layers for c in self.parts):
            raise ValueError("remote run: a part's crcs do not cover every layer")

    def of_part(self, part: int, parts: int) -> RemoteRun | None:
        """This run as the reader of part ``part`` of ``parts`` sees it (its crcs);
        None when the owner keeps another number of parts (other bytes: a miss)."""
        if max(1, len(self.parts)) != parts:
            return None
        if parts == 1:
            return self
        return replace(self, crcs=self.parts[part], parts=())

    @property
    def medium(self) -> Medium:
        return Address.decode(self.address).medium

    @property
    def node(self) -> int:
        return Address.decode(self.address).node

    @property
    def end(self) -> int:
        return self.request_start + self.count


class IndexHit(Protocol):
    """What ``remote_runs`` reads of a cluster index hit (``cluster.RemoteHit``)."""

    @property
    def node(self) -> int: ...
    @property
    def segment_id(self) -> int: ...
    @property
    def position(self) -> int: ...
    @property
    def record(self) -> Mapping[str, Any]: ...


def segment_record(seg: Segment, crcs: Sequence[int], location: str = "",
                   parts: Sequence[Sequence[int]] = ()) -> dict[str, Any]:
    """The record a requester needs to read and verify ``seg`` (JSON-able); ``parts``:
    every part's crcs when the owner keeps several (``crcs`` is part 0's)."""
    for c in (crcs, *parts):
        if len(c) != seg.layout.num_layers:
            raise ValueError(f"segment {seg.segment_id}: {len(c)} crcs for "
                             f"{seg.layout.num_layers} layers")
    lay = seg.layout
    extra = {"parts": [[int(c) for c in p] for p in parts]} if len(parts) > 1 else {}
    return {**extra, "base": seg.base_address, "nb": lay.num_blocks, "nl": lay.num_layers,
            "bbpl": lay.layer_block_bytes[0] if lay.is_uniform else list(
                lay.layer_block_bytes), "hdr": lay.header_bytes,
            "file": location, "foff": int(seg.file_offset or 0),
            "crcs": [int(c) for c in crcs]}


def remote_runs(hits: Sequence[IndexHit], request_start: int,
                layer_block_bytes: tuple[int, ...]) -> tuple[RemoteRun, ...]:
    """The runs of ``hits`` (request blocks ``request_start, request_start + 1, ...``):
    a new run where the node, the segment or the position sequence changes. Stops at
    the first run whose record is malformed, of another geometry, or too short for the
    run (the rest is a miss).
    """
    runs: list[RemoteRun] = []
    at = 0
    while at < len(hits):
        first = hits[at]
        end = at + 1  # the hits continuing first's run: one RemoteRun each run
        while end < len(hits) and hits[end].node == first.node and \
                hits[end].segment_id == first.segment_id and \
                hits[end].position == first.position + end - at:
            end += 1
        try:
            runs.append(_run(first, request_start + at, end - at, layer_block_bytes))
        except (KeyError, TypeError, ValueError):
            break
        at = end
    return tuple(runs)


def _run(hit: IndexHit, request_start: int, count: int,
         layer_block_bytes: tuple[int, ...]) -> RemoteRun:
    rec = hit.record
    sizes = rec["bbpl"]  # one size for layers alike, else one per layer
    sizes = (tuple(int(b) for b in sizes) if isinstance(sizes, list)
             else (int(sizes),) * int(rec["nl"]))
    layout = SegmentLayout(int(rec["nb"]), sizes, int(rec["hdr"]))
    if layout.layer_block_bytes != layer_block_bytes:
        raise ValueError("a segment of another geometry")
    base = int(rec["base"])
    if Address.decode(base).node != hit.node:
        raise ValueError("a segment record naming another node")
    return RemoteRun(base, request_start, hit.position, count, layout, str(rec.get("file", "")),
                     int(rec.get("foff", 0)), tuple(int(c) for c in rec["crcs"]),
                     tuple(tuple(int(c) for c in p) for p in rec.get("parts", ())))


def trim_runs(runs: Sequence[RemoteRun], start: int) -> tuple[RemoteRun, ...]:
    """The part of ``runs`` from request block ``start`` on; empty when they do not
    reach back to it (a remote part must continue the local prefix)."""
    if not runs or runs[0].request_start > start:
        return ()
    out = []
    for run in runs:
        if run.end <= start:
            continue
        cut = max(0, start - run.request_start)
        out.append(replace(run, request_start=run.request_start + cut,
                           start_pos=run.start_pos + cut, count=run.count - cut))
    return tuple(out)


def runs_of_part(runs: Sequence[RemoteRun], part: int, parts: int) -> tuple[RemoteRun, ...]:
    """``runs`` as the reader of part ``part`` of ``parts`` sees them (``of_part``); a
    run of an owner keeping another number of parts ends them (the rest is a miss)."""
    out = []
    for run in runs:
        mine = run.of_part(part, parts)
        if mine is None:
            break
        out.append(mine)
    return tuple(out)
