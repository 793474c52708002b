"""Staging window (FC-CIO data path): restore a read plan layer by layer into paged KV.

One window holds two layer slots, double-buffered. A restore runs on one thread (the
window's owner for the restore's duration)::

    submit reads of layer 0 -> slot 0
    for l in 0..L-1:
        submit reads of layer l+1 -> slot (l+1) % 2     # in flight on the reader's pool
        wait layer l's reads; verify its segment crcs    # ... while this thread
        scatter layer l: slot -> paged KV slots           #     scatters layer l
        (memory blocks: arena -> paged KV directly)
        ready[l].set()                                    # engine may run layer l

When the paged KV is page-aligned (``cio.zerocopy``), the reads go straight into its
slots (``preadv`` iovec lists) and the scatter step is skipped; only bytes bound for no
slot use the staging slot. Which path ran is in ``RestoreOutcome.zero_copy``. With no
copy out of the slots to wait for, a zero-copy restore also reads further ahead: up to
``MAX_LAYERS_AHEAD`` more layers, each with its own staging slot, while fewer than
2 x ``reads_in_flight`` of its commands are unfinished (small segment layers, e.g. a few
MiB per turn, would otherwise leave the disk a shallow queue at every layer boundary).

Slot ``(l+1) % 2`` last held layer ``l-1``, already scattered (scatter is synchronous),
so reusing it is safe. Checksums run beside the reads: the reader thread that completes
a command computes the crc32 of each piece it delivered (the crc releases the GIL, so
the reader threads check in parallel while this thread scatters); this thread only
combines those per-piece crcs into segment-layer crcs. A piece without one (a command
read again in parts after an error, a CUDA slot) is checked here from the slot.
The reads of a restore go through a ``ReadQueue``: at most
``reads_in_flight`` of its commands are with the reader at once (``store.
reads_in_flight``), the rest wait in order, so layer ``l``'s reads always go out before
layer ``l+1``'s.

The plan's *stream* of a layer is a sequence of block-sized positions (``plan.stream``).
``RestoreJob.stream_slots`` maps each stream block to a paged KV slot, or to -1 for a
block read only so that its segment layer can be checked against its crc32 (an older
segment without block crcs is read whole).
A restore the engine may give up on (every load of the vLLM connector,
``RestoreJob.fence``) reads through the staging slots only, and writes each layer into
the paged KV inside its fence: once the engine closed it, no byte of the restore
reaches the KV slots, and the restore reads no more (a restore still queued for a
window reads nothing), keeping its window until the reads it started end.
Checks (``StreamCheck``) run before scatter; a failed check cuts the restore at the
first request block of that segment: blocks from the cut on are *not* loaded, whatever
layers they had reached, and the caller recomputes them. A read command that fails
(EIO, a short read past a torn end of file) is read again in halves down to single
pages, so one bad spot in a merged read fails only the checks of the segments it
touches (which the store then cuts off) and the intact segments merged with it are
still served.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial

import torch

from flatcake.cio.crc import (
    OpGate,
    PieceCrcs,
    crc32,
    crc32_combine,
    crc32_shift_operator,
    crc_pieces,
)
from flatcake.cio.direct import aligned_buffer, writable_view
from flatcake.cio.readers import Reader, ReadQueue, ReadRequest
from flatcake.cio.restore import LayerReady, LoadAbandoned, RestoreJob, RestoreOutcome
from flatcake.cio.zerocopy import SlotViews, op_commands, zero_copy_refusal
from flatcake.layout import ALIGN, align_up
from flatcake.plan.stream import StreamCheck
from flatcake.readplan import LayerPlan, Piece

logger = logging.getLogger(__name__)

DEFAULT_CRC_CHUNK_BYTES = 4 << 20


@dataclass(slots=True)
class _Placement:
    """Stream bytes ``[stream_offset, +length)`` sit at ``src[src_offset:]``."""

    stream_offset: int
    src_offset: int
    length: int
    memory: bool


# Layers a zero-copy restore may have submitted beyond the two of the staging path.
MAX_LAYERS_AHEAD = 4
# Why a restore the engine may give up on is not read straight into the slots.
FENCED = "the engine may give up on this load: its reads land in the staging window"


@dataclass(slots=True)
class _LayerState:
    # Each op's crcs are set once its read landed *and* its pieces' crcs are known:
    # (slot offset, length) -> crc32 (empty when nothing is checked).
    futures: list[tuple[PieceCrcs, tuple[Piece, ...], ReadRequest]] = field(
        default_factory=list)
    crcs: dict[tuple[int, int], int] = field(default_factory=dict)
    commands: int = 0  # read commands submitted (one per op, or per IOV_MAX iovecs)
    direct: bool = False  # read straight into the paged KV (no re-read in parts)
    placements: list[_Placement] = field(default_factory=list)
    unreadable: list[tuple[int, int]] = field(default_factory=list)  # slot [start, end)


class StagingWindow:
    """Two layer slots and the pipeline that fills them. One restore at a time uses a
    window (the store hands windows out from a pool; a restore that finds none waits).

    ``reads_in_flight`` bounds the read commands one restore has with the shared reader
    at once (``None``: no bound; every command of the next layer is handed over as soon
    as it is planned).
    """

    def __init__(self, reader: Reader, crc_threads: int = 1,
                 crc_chunk_bytes: int = DEFAULT_CRC_CHUNK_BYTES,
                 reads_in_flight: int | None = None) -> None:
        if crc_threads < 1 or crc_chunk_bytes < 1:
            raise ValueError(f"crc_threads and crc_chunk_bytes must be >= 1, got "
                             f"{crc_threads} and {crc_chunk_bytes}")
        if reads_in_flight is not None and reads_in_flight < 1:
            raise ValueError(f"store.reads_in_flight must be >= 1, got {reads_in_flight}")
        self.reader = reader
        self.reads_in_flight = reads_in_flight
        self.crc_chunk_bytes = crc_chunk_bytes
        self._slots: list[torch.Tensor] = []
        self._ahead: list[torch.Tensor] = []  # zero-copy restores' extra layer slots
        # Checksums are a CPU cost of every restore (ISA-L's crc32: about 20 GB/s per CPU
        # second on the 2-core reference machine, zlib's about 3, 64 MiB buffers); with
        # several threads a layer's checks run in parallel chunks.
        self._crc_pool = (ThreadPoolExecutor(crc_threads, thread_name_prefix="flatcake-crc")
                          if crc_threads > 1 else None)
        self._shift_ops: dict[int, tuple[int, ...]] = {}  # chunk length -> operator
        # Byte views of the CPU slots, made once (a view per layer costs ~40 us):
        # (address, size) -> view; cleared when the slots are made again.
        self._views: dict[tuple[int, int], memoryview] = {}

    def close(self) -> None:
        if self._crc_pool is not None:
            self._crc_pool.shutdown(wait=True)

    def _ensure_slots(self, slot_bytes: int) -> list[torch.Tensor]:
        if not self._slots or self._slots[0].numel() < slot_bytes:
            size = align_up(max(slot_bytes, 1))
            self._views.clear()
            if self.reader.device_type == "cpu":
                self._slots = [aligned_buffer(size), aligned_buffer(size)]
            else:
                self._slots = [torch.empty(size, dtype=torch.uint8, device="cuda")
                               for _ in range(2)]
        return self._slots

    def run(self, job: RestoreJob, ready: LayerReady) -> RestoreOutcome:
        """Execute ``job``; sets ``ready`` per layer; returns when every layer is done."""
        t0 = time.perf_counter()
        plan = job.plan
        slot_bytes = max((sum(op.length for op in lp.ssd_ops) for lp in plan.layers),
                         default=0)
        slots = self._ensure_slots(slot_bytes)
        sizes = plan.layer_block_bytes
        cut = job.num_request_blocks
        failed: list[int] = []
        commands = 0
        reads = ReadQueue(self.reader, self.reads_in_flight)
        fence = job.fence
        refusal = FENCED if fence is not None and not fence.direct_ok else zero_copy_refusal(
            self.reader, job.paged,
            all(p.dest_offset % sizes[lp.layer] == 0
                and p.length % sizes[lp.layer] == 0
                for lp in plan.layers for op in lp.ssd_ops for p in op.pieces))
        direct = None if refusal else _Direct(SlotViews(job.paged), job.stream_slots.tolist())
        if direct is not None:
            slots = slots + self._ahead_slots(slot_bytes)
        free = list(reversed(slots))
        pending: dict[int, tuple[_LayerState, torch.Tensor]] = {}
        unfinished = 0  # commands of the layers submitted and not finished yet
        n, nxt = len(plan.layers), 0
        try:
            for i, lp in enumerate(plan.layers):
                # One layer ahead on the staging path (two slots); zero-copy goes further
                # ahead while the restore has fewer than 2 x reads_in_flight commands
                # unfinished, so the reader's queue never runs dry at a layer boundary.
                while nxt < n and free and (nxt <= i + 1 or (
                        direct is not None and unfinished < 2 * self._in_flight_goal())):
                    if fence is not None and fence.closed:  # given up: read no more
                        raise LoadAbandoned("the engine stopped waiting for this restore")
                    slot = free.pop()
                    st = self._submit(job, reads, plan.layers[nxt], slot, direct)
                    pending[nxt] = (st, slot)
                    unfinished += st.commands
                    nxt += 1
                state, slot = pending.pop(i)
                unfinished -= state.commands
                commands += state.commands
                bbpl = sizes[lp.layer]
                cut = self._finish_reads(job, reads, state, slot, bbpl, cut)
                cut = self._verify(job, lp.layer, state, slot, bbpl, cut, failed)
                with fence.open() if fence is not None else nullcontext():
                    self._scatter(job, lp.layer, state, slot, bbpl, cut,
                                  memory_only=direct is not None)
                    ready.set(lp.layer)
                    if job.after_layer is not None:
                        job.after_layer(lp.layer, cut)  # overlaps the next layers' reads
                free.append(slot)
        except BaseException:
            reads.abandon()  # no read may still land in the slots once the window is free
            raise
        return RestoreOutcome(cut, tuple(dict.fromkeys(failed)), commands, plan.bytes_read,
                              plan.memory_bytes, time.perf_counter() - t0,
                              reads.peak_in_flight, direct is not None, refusal)

    def _in_flight_goal(self) -> int:
        return self.reads_in_flight if self.reads_in_flight is not None else 8

    def _ahead_slots(self, slot_bytes: int) -> list[torch.Tensor]:
        """Staging slots for the layers a zero-copy restore reads further ahead: they take
        only bytes bound for no paged slot (gaps, blocks read for their crc), so plain
        unpinned mappings whose untouched pages cost nothing."""
        size = align_up(max(slot_bytes, 1))
        if not self._ahead or self._ahead[0].numel() < size:
            self._views.clear()
            self._ahead = [aligned_buffer(size, pin=False) for _ in range(MAX_LAYERS_AHEAD)]
        return self._ahead

    def _slot_view(self, slot: torch.Tensor) -> memoryview:
        key = (slot.data_ptr(), slot.numel())
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = writable_view(slot)
        return view

    def _submit(self, job: RestoreJob, reads: ReadQueue, lp: LayerPlan,
                slot: torch.Tensor, direct: _Direct | None) -> _LayerState:
        state = _LayerState(direct=direct is not None)
        bbpl = job.plan.layer_block_bytes[lp.layer]
        pos = 0
        view = self._slot_view(slot) if slot.device.type == "cpu" else None
        for op in lp.ssd_ops:
            f = job.files[op.file_id]
            req = ReadRequest(f.path, f.fd, op.file_offset, op.length, pos)
            keys = [(pos + p.offset_in_op, p.length) for p in op.pieces]
            checked = PieceCrcs()
            if direct is not None and view is not None:  # zero-copy: always a CPU slot
                gate = OpGate(keys, bool(job.checks), checked)
                for sub_req, iov, pieces in op_commands(
                        op, lp.layer, pos, direct.slots, direct.views, view,
                        bbpl, f.path, f.fd):
                    gate.expect(iov, pieces)
                    state.commands += 1
                    reads.submit(sub_req, iov).add_done_callback(gate.done)
                gate.close()
            else:
                spans = (tuple((k, (view[k[0]:k[0] + k[1]],)) for k in keys)
                         if view is not None and job.checks else ())
                state.commands += 1
                reads.submit(req, slot).add_done_callback(
                    partial(crc_pieces, spans, checked))
            state.futures.append((checked, op.pieces, req))
            for p in op.pieces:
                state.placements.append(_Placement(p.dest_offset, pos + p.offset_in_op,
                                                   p.length, False))
            pos += op.length
        for cop in lp.memory_ops:
            for p in cop.pieces:
                state.placements.append(_Placement(
                    p.dest_offset, cop.arena_offset + p.offset_in_op, p.length, True))
        state.placements.sort(key=lambda pl: pl.stream_offset)
        return state

    def _request_floor(self, job: RestoreJob, pieces: Sequence[Piece], bbpl: int) -> int:
        """Smallest request block that ``pieces`` would have delivered."""
        low = job.num_request_blocks
        for p in pieces:
            first = p.dest_offset // bbpl
            last = (p.dest_offset + p.length - 1) // bbpl
            for b in range(first, last + 1):
                r = job.stream_request[b]
                if r >= 0:
                    low = min(low, r)
                    break
        return low

    def _finish_reads(self, job: RestoreJob, reads: ReadQueue, state: _LayerState,
                      slot: torch.Tensor, bbpl: int, cut: int) -> int:
        for fut, pieces, req in state.futures:
            try:
                state.crcs.update(fut.result())
            except OSError as exc:
                if state.direct:  # the bytes went to the paged KV: the op is lost
                    logger.warning("restore read failed: %s", exc)
                    state.unreadable.append((req.dest_offset, req.dest_offset + req.length))
                    cut = min(cut, self._request_floor(job, pieces, bbpl))
                    continue
                logger.warning("restore read failed: %s; reading it again in parts", exc)
                state.unreadable += self._read_in_parts(reads, req, slot)
                if not job.checks:  # nothing can tell the good parts: cut at the first
                    cut = min(cut, self._request_floor(job, pieces, bbpl))
        return cut

    @staticmethod
    def _read_in_parts(reads: ReadQueue, req: ReadRequest,
                       slot: torch.Tensor) -> list[tuple[int, int]]:
        """Re-read a failed command in 4 KiB-aligned halves, down to single pages;
        returns the slot ranges ``[start, end)`` that still cannot be read."""
        bad: list[tuple[int, int]] = []
        stack = [req]
        first = True
        while stack:
            r = stack.pop()
            if not first:
                try:
                    reads.submit(r, slot).result()
                    continue
                except OSError:
                    pass
            first = False
            if r.length <= ALIGN:
                bad.append((r.dest_offset, r.dest_offset + r.length))
                continue
            half = align_up(r.length // 2)
            stack.append(ReadRequest(r.path, r.fd, r.file_offset + half, r.length - half,
                                     r.dest_offset + half))
            stack.append(ReadRequest(r.path, r.fd, r.file_offset, half, r.dest_offset))
        return bad

    def _verify(self, job: RestoreJob, layer: int, state: _LayerState, slot: torch.Tensor,
                bbpl: int, cut: int, failed: list[int]) -> int:
        if not job.checks:
            return cut
        starts = [pl.stream_offset for pl in state.placements]
        checks: list[tuple[StreamCheck, list[tuple[int, int]]]] = []
        for check in job.checks:
            if check.request_start >= cut:
                continue
            lo = (check.stream_start + check.layer_skip(layer)) * bbpl
            hi = (check.stream_start + check.num_blocks) * bbpl
            if lo == hi:
                continue  # a window: this layer holds none of the checked blocks
            ranges: list[tuple[int, int]] = []  # (slot offset, length), stream order
            i = max(0, bisect.bisect_right(starts, lo) - 1)
            while i < len(state.placements) and state.placements[i].stream_offset < hi:
                pl = state.placements[i]
                a = max(lo, pl.stream_offset)
                b = min(hi, pl.stream_offset + pl.length)
                if a < b and not pl.memory:
                    ranges.append((pl.src_offset + (a - pl.stream_offset), b - a))
                i += 1
            if sum(n for _, n in ranges) != hi - lo or any(
                    a < e and s < a + n for a, n in ranges for s, e in state.unreadable):
                ranges = []  # not all of the segment layer was read: cannot pass
            checks.append((check, ranges))
        for (check, ranges), crc in zip(checks, self._combined_crcs(state, slot, checks),
                                        strict=True):
            expected = check.layer_crcs[layer] if layer < len(check.layer_crcs) else None
            if not ranges or crc != expected:
                logger.warning("segment %d layer %d failed its crc32 check; blocks from "
                               "request block %d on are a miss", check.tag, layer,
                               check.request_start)
                failed.append(check.tag)
                cut = min(cut, check.request_start)
        return cut

    def _combined_crcs(self, state: _LayerState, slot: torch.Tensor,
                       checks: list[tuple[StreamCheck, list[tuple[int, int]]]]) -> list[int]:
        """crc32 of each check's ranges (concatenated), from the crcs the reader threads
        computed; ranges they did not cover are checked here from the slot."""
        missing = list(dict.fromkeys(r for _, ranges in checks for r in ranges
                                     if r not in state.crcs))
        known = state.crcs
        if missing:
            view = writable_view(slot if slot.device.type == "cpu" else slot.cpu())
            known = dict(known)
            known.update(zip(missing, self._crcs(view, [[r] for r in missing]), strict=True))
        out = []
        for _, ranges in checks:
            crc = 0
            for i, (off, n) in enumerate(ranges):
                crc = known[(off, n)] if i == 0 else crc32_combine(
                    crc, known[(off, n)], self._shift_op(n))
            out.append(crc)
        return out

    def _shift_op(self, n: int) -> tuple[int, ...]:
        op = self._shift_ops.get(n)
        if op is None:
            op = self._shift_ops[n] = crc32_shift_operator(n)
        return op

    def _crcs(self, view: memoryview, checks: list[list[tuple[int, int]]]) -> list[int]:
        """crc32 of each check's ranges (concatenated). With a crc pool, ranges are cut
        into ``crc_chunk_bytes`` chunks checked in parallel and combined in order."""
        if self._crc_pool is None:
            out = []
            for ranges in checks:
                crc = 0
                for off, n in ranges:
                    crc = crc32(view[off:off + n], crc)
                out.append(crc)
            return out
        chunk = self.crc_chunk_bytes
        tasks = [(i, off + k, min(chunk, n - k))
                 for i, ranges in enumerate(checks) for off, n in ranges
                 for k in range(0, n, chunk)]
        crcs = self._crc_pool.map(lambda t: crc32(view[t[1]:t[1] + t[2]]), tasks)
        out = [0] * len(checks)
        for (i, _, n), crc in zip(tasks, crcs, strict=True):
            out[i] = crc32_combine(out[i], crc, self._shift_op(n))
        return out

    def _scatter(self, job: RestoreJob, layer: int, state: _LayerState, slot: torch.Tensor,
                 bbpl: int, cut: int, memory_only: bool = False) -> None:
        # Whole blocks go straight from the slot (or the arena) to the paged KV; a block
        # split across two reads (a max_read_bytes split inside it) is assembled first.
        # ``memory_only``: the SSD bytes are already in place (zero-copy).
        assembling: dict[int, tuple[torch.Tensor, int]] = {}
        for pl in state.placements:
            if memory_only and not pl.memory:
                continue
            src = slot if not pl.memory else job.arena
            if src is None:
                raise ValueError("the read plan copies from the host arena, but the "
                                 "restore has no arena")
            pos, end = pl.stream_offset, pl.stream_offset + pl.length
            while pos < end:
                block, inner = divmod(pos, bbpl)
                s = pl.src_offset + (pos - pl.stream_offset)
                if inner == 0 and end - pos >= bbpl:
                    whole = (end - pos) // bbpl
                    self._scatter_blocks(job, layer, block, src[s:s + whole * bbpl], cut)
                    pos += whole * bbpl
                    continue
                n = min(bbpl - inner, end - pos)
                buf, filled = assembling.get(block) or (
                    torch.empty(bbpl, dtype=torch.uint8, device=src.device), 0)
                buf[inner:inner + n].copy_(src[s:s + n])
                assembling[block] = (buf, filled + n)
                if filled + n == bbpl:
                    self._scatter_blocks(job, layer, block, buf, cut)
                    del assembling[block]
                pos += n

    @staticmethod
    def _scatter_blocks(job: RestoreJob, layer: int, first: int, src: torch.Tensor,
                        cut: int) -> None:
        """Scatter stream blocks ``[first, first + n)`` held in ``src``."""
        bbpl = job.plan.layer_block_bytes[layer]
        n = src.numel() // bbpl
        slots = job.stream_slots[first:first + n]
        req = job.stream_request[first:first + n]
        keep = [0 <= r < cut for r in req]
        if all(keep):
            job.paged.scatter(layer, slots, src)
            return
        if not any(keep):
            return
        mask = torch.tensor(keep, dtype=torch.bool)
        rows = src.view(n, bbpl)[mask.to(src.device)].reshape(-1)
        job.paged.scatter(layer, slots[mask.to(slots.device)], rows)


@dataclass(frozen=True, slots=True)
class _Direct:
    """A zero-copy restore's destination: block-part views and each stream block's slot."""

    views: SlotViews
    slots: list[int]
