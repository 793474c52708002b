"""The remote part of a load: blocks other nodes hold, read by the remote readers of the
executor's ``(medium, node)`` dispatch, verified, then scattered into the paged KV.

A remote reader (``RemoteReader``; NIXL-backed ones in ``cio.remote_readers``) reads
whole layers of one segment of its node and hands them, layer by layer, to a callback
while it holds its receive window. ``restore_remote`` walks the layers in groups that fit
the smallest window, and in each group every run in request order: it checks each
layer's crc32 against the owner's record *before* any block of it reaches the paged KV,
scatters the run's blocks of that layer, and signals the group's layers ready. A run
whose node has no reader, whose read fails or times out (a dead or slow owner: the
reader's wait is bounded), or whose bytes fail a crc ends the loaded prefix at its first
block; later runs are not read. The result is the verified prefix, as for local loads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from flatcake.cio.crc import crc32
from flatcake.cio.paged import PagedKV
from flatcake.cio.restore import LayerReady
from flatcake.control.address import Medium
from flatcake.plan.remote import RemoteRun
from flatcake.plan.tasks import LoadTask

logger = logging.getLogger(__name__)

Consume = Callable[[int, np.ndarray], bool]
"""``consume(layer, bytes of that whole segment layer)``; False stops the read."""


class RemoteReader(Protocol):
    """Reads whole segment layers from one other node (one medium)."""

    @property
    def window_bytes(self) -> int:
        """The most bytes one ``read_layers`` call may ask for."""
        ...

    def read_layers(self, run: RemoteRun, layers: range, consume: Consume) -> bool:
        """Read ``layers`` of ``run``'s segment and call ``consume`` for each, in layer
        order (the bytes are valid during the call only). False when the read failed,
        timed out, or ``consume`` refused a layer: nothing after it was consumed."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RemoteOutcome:
    """The remote part of a load: request blocks ``[.., loaded_end)`` are in place;
    ``bytes_read`` crossed the network; ``misses`` says why it stopped early."""

    loaded_end: int
    bytes_read: int
    misses: tuple[str, ...] = ()


def restore_remote(runs: Sequence[RemoteRun], reader_of: Callable[[Medium, int],
                                                                  RemoteReader | None],
                   paged: PagedKV, block_ids: Sequence[int],
                   on_layers: Callable[[range], None]) -> RemoteOutcome:
    """Read, verify and scatter ``runs`` (see the module docstring); ``on_layers`` is
    called once a group of layers is in place for every run still in the prefix."""
    num_layers = paged.num_layers
    if not runs:
        on_layers(range(num_layers))
        return RemoteOutcome(0, 0)
    cut = runs[-1].end
    misses: list[str] = []
    readers: list[RemoteReader | None] = []
    per_group = num_layers
    for run in runs:
        reader = reader_of(run.medium, run.node) if run.request_start < cut else None
        readers.append(reader)
        widest = max(run.layout.layer_bytes(x) for x in range(num_layers))
        if reader is None or reader.window_bytes < widest:
            if run.request_start < cut:
                misses.append(f"node {run.node}: no {run.medium.name} reader or a window "
                              "smaller than one layer")
            cut = min(cut, run.request_start)
            continue
        per_group = min(per_group, reader.window_bytes // widest)
    moved = 0
    for lo in range(0, num_layers, max(1, per_group)):
        layers = range(lo, min(num_layers, lo + per_group))
        for run, reader in zip(runs, readers, strict=True):
            if run.request_start >= cut or reader is None:
                break
            slots = torch.tensor(list(block_ids[run.request_start:run.end]),
                                 dtype=torch.int64, device=paged.device)
            why: list[str] = []
            ok = reader.read_layers(run, layers, _consumer(run, paged, slots, why))
            if not ok:
                misses.append(f"node {run.node} segment at {run.address:#x}: "
                              f"{why[0] if why else 'read failed or timed out'}")
                cut = run.request_start
                break
            moved += sum(run.layout.layer_bytes(x) for x in layers)
        on_layers(layers)
    for miss in misses:
        logger.warning("remote blocks are a miss: %s", miss)
    return RemoteOutcome(cut, moved, tuple(misses))


def _consumer(run: RemoteRun, paged: PagedKV, slots: torch.Tensor, why: list[str]
              ) -> Consume:
    def consume(layer: int, data: np.ndarray) -> bool:
        bbpl = run.layout.layer_block_bytes[layer]
        lo, hi = run.start_pos * bbpl, (run.start_pos + run.count) * bbpl
        if data.nbytes != run.layout.layer_bytes(layer):
            why.append(f"layer {layer}: {data.nbytes} bytes, expected "
                       f"{run.layout.layer_bytes(layer)}")
            return False
        if crc32(data.data) != run.crcs[layer]:
            why.append(f"layer {layer} failed its crc32")
            return False
        paged.scatter(layer, slots, torch.from_numpy(data[lo:hi]))
        return True

    return consume


def remote_part(task: LoadTask, paged: PagedKV, loaded: int, ready: LayerReady,
                reader_of: Callable[[Medium, int], RemoteReader | None]) -> tuple[int, int]:
    """``task``'s remote runs once its local prefix is whole (``loaded`` blocks), with
    ``ready`` signalled per layer group: (blocks loaded, bytes moved). Every layer of
    ``ready`` is set on return; a failure is a miss, never a crash."""
    try:
        if loaded >= task.num_blocks:
            def signal(layers: range) -> None:
                for layer in layers:
                    ready.set(layer)

            far = restore_remote(task.remote, reader_of, paged, task.block_ids, signal)
            return max(loaded, far.loaded_end), far.bytes_read
    except Exception as exc:
        logger.warning("FlatCake remote load for request %s failed: %s", task.request_id,
                       exc)
    finally:
        for layer in range(ready.num_layers):
            ready.set(layer)
    return loaded, 0
