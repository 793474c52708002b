"""Memory copies filled by a restore (``placement.copy_on_restore``), layer by layer.

The books may ask a restore that reads whole SSD segments to also fill memory copies of
them (``LoadTask.refills``: home segment, its first request block, its block count, the
copy's arena range; one entry per arena extent of a copy split over several). The
restore thread copies each layer of those segments from the
paged KV into the copy's arena range right after that layer is verified and scattered,
while the reads of the next layer are in flight (``RestoreJob.after_layer``)::

    layer l: reads land -> verify -> scatter -> ready[l] -> copy layer l of each refill
                                                            (reads of layer l+1 in flight)

So the copy overlaps the reads and the restore ends one layer's copy after its last
read, unless copying is slower than reading (then the copy sets the pace). On a GPU
paged KV each layer copy is a device-to-host transfer, on a host one a memcpy; the
replay charges the same pipeline (``replay.systems.flatcake``).

A copy is reported written only when every layer of every piece of it was copied, its
segment passed
its checks and the restore did not cut before it; the books free the others. A copy
that fails to write is an optimisation lost, never a failed load.
"""

from __future__ import annotations

import logging

from flatcake.cio.arena import ArenaBuffer
from flatcake.cio.paged import PagedKV
from flatcake.cio.writer import MemoryCopy
from flatcake.plan.tasks import LoadTask

logger = logging.getLogger(__name__)


class LayerRefills:
    """The memory copies of one restore, filled layer by layer (``after_layer``)."""

    def __init__(self, task: LoadTask, paged: PagedKV, arena: ArenaBuffer,
                 layer_window_blocks: tuple[int, ...] = ()) -> None:
        self._refills: list[tuple[int, int, int, MemoryCopy | None]] = []
        self._layers: list[int] = []  # layers copied, per entry (a piece of a copy)
        for home_id, start, count, offset, nbytes in task.refills:
            try:
                ids = paged.block_table(task.block_ids[start:start + count], unique=False)
                copy: MemoryCopy | None = MemoryCopy(arena.view(offset, nbytes), paged, ids,
                                                    layer_window_blocks)
            except Exception as exc:  # never fail the load
                logger.warning("FlatCake memory copy of segment %d not written: %s",
                               home_id, exc)
                copy = None
            self._refills.append((home_id, start, count, copy))
            self._layers.append(0)
        self._num_layers = paged.num_layers

    def after_layer(self, layer: int, cut: int) -> None:
        """Layer ``layer`` of request blocks ``[0, cut)`` is in the paged KV: copy it
        for every refill still whole."""
        for i, (home_id, start, count, copy) in enumerate(self._refills):
            if copy is None or start + count > cut or self._layers[i] != layer:
                continue
            try:
                copy.layer(layer)
            except Exception as exc:
                logger.warning("FlatCake memory copy of segment %d not written: %s",
                               home_id, exc)
                continue
            self._layers[i] = layer + 1

    def written(self, loaded: int, failed: tuple[int, ...]) -> tuple[int, ...]:
        """Home segment ids whose copies hold verified bytes of every layer in every
        piece, given the restore's final cut (``loaded`` request blocks) and its failed
        checks."""
        whole: dict[int, bool] = {}
        for i, (home_id, start, count, _copy) in enumerate(self._refills):
            whole[home_id] = whole.get(home_id, True) and home_id not in failed and \
                start + count <= loaded and self._layers[i] == self._num_layers
        return tuple(home_id for home_id, ok in whole.items() if ok)
