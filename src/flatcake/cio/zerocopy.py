"""Zero-copy restores: read segment layers straight into the paged KV slots.

When the destination allows it, a restore needs no staging copy: each read command is
a ``preadv`` whose iovecs are the paged KV slots of the blocks it carries (a block is
one iovec, or two for a ``kv_blocks`` layout: K at ``t[0, b]``, V at ``t[1, b]``),
in file order. Bytes that go to no slot (gaps merged into a read, blocks read only to
check their segment's crc) land in the staging slot at the offsets the staging path
would use. At most ``IOV_MAX`` iovecs go in one command; a longer list is split.

O_DIRECT needs every iovec's address and length aligned to the device's logical block
size (4096 is asked here). Where the destination is not aligned (torch's CPU allocator
returns 64-byte-aligned storage; a 300-byte block), or reads go to a GPU (GDS), the
restore uses the staging window and one copy (blocks from the host arena are copied
into their slots on both paths);
``zero_copy_refusal`` says why, and the load result says which path ran.

Damage: the reader thread checks each command's pieces as it completes; a segment
layer that fails its crc cuts the restore there as on the staging path, but its bytes
*are* already in the slots (so are those of any block past the cut): the engine must
use only the ``num_blocks_loaded`` blocks the result reports, which it always must.
"""

from __future__ import annotations

from collections.abc import Iterator

from flatcake.cio.direct import writable_view
from flatcake.cio.paged import PagedKV
from flatcake.cio.readers import IOV_MAX, IoVec, Reader, ReadRequest
from flatcake.layout import ALIGN
from flatcake.readplan import ReadOp


def zero_copy_refusal(reader: Reader, paged: PagedKV, pieces_whole_blocks: bool) -> str:
    """Why a restore cannot read straight into ``paged`` ("" when it can). Blocks the
    plan copies from the host arena are copied into their slots either way."""
    if reader.name != "direct" or paged.device.type != "cpu":
        return "reads go to a GPU buffer"
    if not pieces_whole_blocks:
        return "a read splits a block"
    return paged.direct_io_refusal(ALIGN)


class SlotViews:
    """Writable byte views of each layer's paged KV memory, cut into block parts."""

    def __init__(self, paged: PagedKV) -> None:
        self._layers = [writable_view(t) for t in paged.layer_bytes()]
        self._kv = paged.kv_layout == "kv_blocks"
        self._parts = paged.layer_parts

    def block(self, layer: int, slot: int) -> tuple[memoryview, ...]:
        """The iovecs of block ``slot`` of ``layer`` (its bytes in file order)."""
        part, stride, plane = self._parts[layer]
        mv, at = self._layers[layer], slot * stride
        if not self._kv:
            return (mv[at:at + part],)
        return (mv[at:at + part], mv[plane + at:plane + at + part])

    def blocks(self, layer: int, slots: list[int]) -> list[memoryview]:
        """The iovecs of blocks ``slots`` of ``layer``, in order (``block`` of each, in
        one pass: a restore cuts one view per block part, 16,384 for 1 GiB of 64 KiB
        blocks, so the per-block Python cost is the restore thread's largest)."""
        part, stride, plane = self._parts[layer]
        mv = self._layers[layer]
        if not self._kv:
            return [mv[s * stride:s * stride + part] for s in slots]
        out: list[memoryview] = []
        for s in slots:
            at = s * stride
            out += (mv[at:at + part], mv[plane + at:plane + at + part])
        return out


def op_commands(op: ReadOp, layer: int, stream_pos: int, slots: list[int],
                views: SlotViews, staging: memoryview, bbpl: int, path: str, fd: int,
                ) -> Iterator[tuple[ReadRequest, IoVec, list[tuple[int, int, int]]]]:
    """The vectored commands of one read op: ``(request, iovecs, pieces)``, where
    ``pieces`` lists ``(piece index, first iovec, end iovec)`` of the iovecs of this
    command that carry each piece (a piece may span commands). ``stream_pos`` is where
    the op's bytes would sit in the staging slot; ``slots`` maps stream blocks to paged
    slots (-1: read for its checksum only)."""
    iov: list[memoryview] = []
    spans: list[tuple[int, int, int]] = []  # (piece index, first iovec, end iovec)
    cur = 0
    for k, p in enumerate(op.pieces):
        if p.offset_in_op > cur:  # gap bytes: into the staging slot
            iov.append(staging[stream_pos + cur:stream_pos + p.offset_in_op])
        first = p.dest_offset // bbpl
        run = slots[first:first + p.length // bbpl]
        start = len(iov)
        if -1 not in run:
            iov += views.blocks(layer, run)
        else:  # some blocks are read for their checksum only: staging for those
            for b, slot in enumerate(run):
                at = stream_pos + p.offset_in_op + b * bbpl
                iov += views.block(layer, slot) if slot >= 0 else (staging[at:at + bbpl],)
        if len(iov) > start:
            spans.append((k, start, len(iov)))
        cur = p.offset_in_op + p.length
    if cur < op.length:
        iov.append(staging[stream_pos + cur:stream_pos + op.length])
    offset = 0
    for start in range(0, len(iov), IOV_MAX):
        end = min(start + IOV_MAX, len(iov))
        chunk = iov[start:end]
        length = sum(map(len, chunk))
        pieces = [(k, max(lo, start) - start, min(hi, end) - start)
                  for k, lo, hi in spans if lo < end and hi > start]
        yield (ReadRequest(path, fd, op.file_offset + offset, length, 0), IoVec(tuple(chunk)),
               pieces)
        offset += length
