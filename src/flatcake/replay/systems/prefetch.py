"""SGLang HiCache's L3 prefetch, as its code behaves, for the ``tiered`` baseline.

Sources read (sgl-project/sglang): ``python/sglang/srt/managers/cache_controller.py``
(``prefetch_io_aux_func``, ``_page_transfer``, ``prefetch_rate_limited``,
``prefetch_capacity_limit``, ``terminate_prefetch``) and
``python/sglang/srt/mem_cache/hiradix_cache.py`` (``prefetch_from_storage``,
``can_terminate_prefetch``, ``check_prefetch_progress``,
``_prefetch_timeout_check_linear_func``); kvcache-ai/Mooncake
``mooncake-store/src/storage_backend.cpp`` (``BucketStorageBackend::BatchLoad``) and
``mooncake-store/src/file_storage.cpp`` (``AllocateBatch``).

* **Issue.** When a request arrives, the SSD part of its hit (at least
  ``prefetch_threshold`` = 256 tokens) is prefetched into the engine's host pool, unless
  the prefetches already reserved on that engine hold ``prefetch_capacity_limit`` = 50%
  of its host pool (``prefetch_rate_limited``: no prefetch). A prefetch larger than the
  pool's free room is *truncated* to it, not dropped. The reservation is held until the
  request is scheduled.
* **One prefetch thread per engine** (``prefetch_io_aux_func``) runs the prefetches one
  after the other, each in batches of ``STORAGE_BATCH_SIZE`` = 128 pages. A batch is one
  Mooncake ``BatchGet``: staging is allocated per batch (``AllocateBatch``, never the
  whole restore), and with the default read path (``MOONCAKE_OFFLOAD_USE_URING`` off)
  the batch's objects are read with sequential ``pread``s, one command in flight; the
  io_uring setting keeps the drive's queue depth busy instead.
* **Termination** (``--hicache-storage-prefetch-policy``): ``best_effort`` (the default)
  lets the scheduler take the request as soon as it can run and terminates the prefetch
  then: the pages of finished batches are used, the rest is recomputed, and a batch
  being read is read to its end and thrown away. ``wait_complete`` keeps the request
  out of the running set until its prefetch is complete. ``timeout`` waits until
  complete or ``base + per_ki_token * tokens / 1024`` seconds (capped) have passed.

Everything here is driven by the node's event loop (single thread).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from flatcake.replay.workload.runs import Runs, runs_len, slice_runs

POLICIES: tuple[str, ...] = ("best_effort", "wait_complete", "timeout")


class PrefetchOp:
    """One request's L3 prefetch (SGLang ``PrefetchOperation``)."""

    __slots__ = ("batch_blocks", "done_blocks", "finished", "in_flight", "parts", "req",
                 "reserved_blocks", "terminated", "total_blocks")

    def __init__(self, req: Any, parts: Runs, reserved_blocks: int) -> None:
        self.req = req
        self.parts = parts  # SSD-only blocks to fetch, in prefix order
        self.total_blocks = runs_len(parts)
        self.reserved_blocks = reserved_blocks  # host-pool pages held until scheduled
        self.done_blocks = 0  # pages of finished batches
        self.batch_blocks = 0  # pages of the batch being read
        self.in_flight = False
        self.terminated = False
        self.finished = False  # the thread is done with it (complete or terminated)

    @property
    def complete(self) -> bool:
        return self.done_blocks >= self.total_blocks


class PrefetchThread:
    """An engine's one prefetch I/O thread: prefetches in order, batch by batch.

    ``read_batch(op, parts) -> end_s`` submits one batch's reads and returns when they
    finish; ``on_batch(op, parts, used)`` is called at each batch end (``used`` False for
    a batch whose prefetch was terminated meanwhile: its bytes are thrown away);
    ``on_finish(op)`` when the thread is done with an op.
    """

    __slots__ = ("batch_pages", "busy", "loop", "on_batch", "on_finish", "queue",
                 "read_batch")

    def __init__(self, loop: Any, batch_pages: int,
                 read_batch: Callable[[PrefetchOp, Runs], float],
                 on_batch: Callable[[PrefetchOp, Runs, bool], None],
                 on_finish: Callable[[PrefetchOp], None]) -> None:
        if batch_pages <= 0:
            raise ValueError(f"PrefetchThread.batch_pages must be > 0, got {batch_pages}")
        self.loop = loop
        self.batch_pages = batch_pages
        self.read_batch = read_batch
        self.on_batch = on_batch
        self.on_finish = on_finish
        self.queue: deque[PrefetchOp] = deque()
        self.busy = False

    def submit(self, op: PrefetchOp) -> None:
        self.queue.append(op)
        if not self.busy:
            self._next()

    def _next(self) -> None:
        while self.queue:
            op = self.queue[0]
            if op.terminated or op.complete:
                self.queue.popleft()
                op.finished = True
                self.on_finish(op)
                continue
            a = op.done_blocks
            b = min(a + self.batch_pages, op.total_blocks)
            parts = slice_runs(op.parts, a, b)
            op.batch_blocks = b - a
            op.in_flight = True
            self.busy = True
            end = self.read_batch(op, parts)
            self.loop.at(end, self._batch_done, (op, parts))
            return
        self.busy = False

    def _batch_done(self, arg: tuple[PrefetchOp, Runs]) -> None:
        op, parts = arg
        op.in_flight = False
        used = not op.terminated
        if used:
            op.done_blocks += op.batch_blocks
        op.batch_blocks = 0
        self.on_batch(op, parts, used)
        self._next()


def timeout_s(tokens: int, base_s: float, per_ki_token_s: float, max_s: float) -> float:
    """SGLang's linear prefetch timeout for a prefetch of ``tokens`` tokens."""
    return min(max_s, base_s + per_ki_token_s * tokens / 1024)
