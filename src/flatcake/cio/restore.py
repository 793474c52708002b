"""What a restore is given and what it gives back: the job (read plan, paged KV, stream
slots, checks, files), the per-layer ready signals, the fence an engine that gives up
on a load closes, and the outcome. Built by the executor (``cio.executor``), run by a
staging window (``cio.staging``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from flatcake.cio.paged import PagedKV
from flatcake.plan.stream import StreamCheck
from flatcake.readplan import ReadPlan


@dataclass(frozen=True, slots=True)
class OpenFile:
    """A session file a restore reads: its path and an open descriptor."""

    path: str
    fd: int


@dataclass(slots=True)
class RestoreJob:
    """Everything one restore needs; built by the store, consumed by ``StagingWindow``.

    Attributes:
        plan: the read plan (its pieces address the stream).
        paged: the destination paged KV.
        stream_slots: (stream blocks,) int64 paged slot of each stream block, -1 = drop.
        stream_request: request block index of each stream block, -1 = drop.
        checks: segment crc checks.
        files: file_id -> open file, for every file the plan reads.
        arena: the host arena (source of memory copies).
        num_request_blocks: blocks the restore would load if nothing fails.
        after_layer: called with ``(layer, cut)`` once a layer is in the paged KV (the
            memory copies a restore fills, ``cio.refill``).
        fence: closed by an engine that stopped waiting for this restore (``Fence``);
            None when the engine always waits for it.
    """

    plan: ReadPlan
    paged: PagedKV
    stream_slots: torch.Tensor
    stream_request: list[int]
    checks: tuple[StreamCheck, ...]
    files: Mapping[int, OpenFile]
    arena: torch.Tensor | None
    num_request_blocks: int
    after_layer: Callable[[int, int], None] | None = None
    fence: Fence | None = None


@dataclass(frozen=True, slots=True)
class RestoreOutcome:
    """What a restore did.

    Attributes:
        num_blocks_loaded: request blocks ``[0, num_blocks_loaded)`` are in the paged KV.
        failed_tags: checks that failed (damaged segments), plus tags of unreadable ones.
        commands: SSD read commands issued.
        bytes_read: SSD bytes read (useful + gap + verify-only).
        memory_bytes: bytes copied out of the arena.
        elapsed_s: wall time from start to the last layer ready.
        peak_reads_in_flight: most read commands the restore had with the reader at
            once (never above the window's ``reads_in_flight``).
        zero_copy: the reads went straight into the paged KV slots (``cio.zerocopy``);
            ``zero_copy_refusal`` says why not otherwise ("" when they did).
    """

    num_blocks_loaded: int
    failed_tags: tuple[int, ...]
    commands: int
    bytes_read: int
    memory_bytes: int
    elapsed_s: float
    peak_reads_in_flight: int = 0
    zero_copy: bool = False
    zero_copy_refusal: str = ""


class LayerReady:
    """Per-layer "ready" signals of one restore, set by the restore thread."""

    def __init__(self, num_layers: int) -> None:
        self._events = [threading.Event() for _ in range(num_layers)]
        self._error: BaseException | None = None

    @property
    def num_layers(self) -> int:
        return len(self._events)

    def set(self, layer: int) -> None:
        self._events[layer].set()

    def fail(self, error: BaseException) -> None:
        """Wake every waiter; they re-raise ``error``."""
        self._error = error
        for ev in self._events:
            ev.set()

    def wait_for_layer(self, layer: int, timeout: float | None = None) -> bool:
        """Block until layer ``layer`` is in the paged KV (False on timeout). Blocks
        past the restore's final cut may still be wrong: the final result is the truth.
        """
        if not 0 <= layer < len(self._events):
            raise ValueError(f"layer must be in [0, {len(self._events)}), got {layer}")
        ok = self._events[layer].wait(timeout)
        if self._error is not None:
            raise RuntimeError("restore failed") from self._error
        return ok


class LoadAbandoned(RuntimeError):
    """The engine stopped waiting for this restore (its ``Fence`` is closed)."""


class Fence:
    """Keeps a restore's late bytes out of the engine's KV once the engine gave up on it.

    The restore thread writes into the paged KV (and the arena's memory copies) only
    inside ``open()``; ``close()`` takes the same lock, so once it returns no write is
    running and none starts: a late restore stops at its next layer and its reads land
    only in its staging window, which it keeps until they end (``ReadQueue.abandon``).
    A fenced restore never reads straight into the KV slots (zero-copy): a read the
    kernel still holds cannot be called back. ``direct_ok`` lets it (a store's restore,
    abandoned only when the store closes, keeps zero-copy's speed): the fence then stops
    its copies and its next reads, but a read already with the disk still lands.
    """

    def __init__(self, direct_ok: bool = False) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self.direct_ok = direct_ok

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Give up on the restore; waits for a layer's write already running (a copy,
        never a read)."""
        with self._lock:
            self._closed = True

    @contextmanager
    def open(self) -> Iterator[None]:
        """Hold the fence open for one write; raises ``LoadAbandoned`` once closed."""
        with self._lock:
            if self._closed:
                raise LoadAbandoned("the engine stopped waiting for this restore")
            yield
