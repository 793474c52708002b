"""Per layer kind: what a system writes and reads of each kind of layer.

A model's layers may differ (``geometry.LayerGroup``: DeepSeek-V4-Flash's sliding-window,
c4a and c128a layers); every count here is per layer and summed per kind
(``KVGeometry.kind_bytes``), as ``flatcake inspect`` counts a store's files:

* ``stored_layers``: the layers a store holds when the engine does not prefix-cache
  some kinds (``NodeSpec.uncached_kinds``), as the vLLM connector stores only the
  prefix-cacheable groups;
* ``LayerBooks``: the SSD bytes a store wrote per kind, what its windows saved against
  storing every block (a sliding-window layer keeps its segment's last ``window``
  blocks), what it did not store (the kinds the engine rebuilds), and its read commands
  per restore per kind;
* ``direct_reads``: one block read straight into the GPU, one command per layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from flatcake.geometry import KVGeometry, LayerGroup
from flatcake.layout import SegmentLayout
from flatcake.readplan import ReadPlan
from flatcake.replay.node.devices import NodeSpec


def stored_layers(geometry: KVGeometry,
                  uncached_kinds: Sequence[str]) -> tuple[KVGeometry, tuple[int, ...]]:
    """The geometry of the layers a store holds, those not of ``uncached_kinds`` (the
    kinds the engine does not prefix-cache), and their indices in ``geometry``:
    ``geometry`` itself when it stores every layer."""
    if not uncached_kinds:
        return geometry, tuple(range(geometry.num_layers))
    kept: list[LayerGroup] = []
    layers: list[int] = []
    at = 0
    for grp in geometry.layer_groups:
        if grp.kind not in uncached_kinds:
            kept.append(grp)
            layers.extend(range(at, at + grp.num_layers))
        at += grp.num_layers
    if not kept:
        raise ValueError(f"geometry {geometry.name}: the engine prefix-caches none of its "
                         f"layer kinds ({', '.join(g.kind for g in geometry.layer_groups)} "
                         f"all in uncached_kinds), so there is nothing to store")
    if len(kept) == len(geometry.layer_groups):
        return geometry, tuple(layers)
    return dataclasses.replace(geometry, num_layers=len(layers), groups=tuple(kept)), \
        tuple(layers)


class LayerBooks:
    """Bytes written and commands read, per layer of ``geometry``, of one system on one
    node; ``stored``: the layers its segments hold, in their order (all by default;
    ``stored_layers``)."""

    def __init__(self, geometry: KVGeometry, stored: Sequence[int] | None = None) -> None:
        self.geometry = geometry
        n = geometry.num_layers
        self.stored = np.arange(n) if stored is None else np.asarray(stored, dtype=np.int64)
        self.sizes = np.asarray(geometry.layer_block_bytes, dtype=np.int64)
        self.written = np.zeros(n, dtype=np.int64)  # SSD bytes stored, per layer
        self.blocks_written = 0
        self.commands = np.zeros(n, dtype=np.int64)  # SSD read commands, per layer
        self.restores = 0  # restores that read the SSD

    def wrote(self, layout: SegmentLayout) -> None:
        """An SSD segment written."""
        self.blocks_written += layout.num_blocks
        self.written[self.stored] += [layout.layer_bytes(k) for k in range(len(self.stored))]

    def read_plan(self, plan: ReadPlan) -> None:
        """A restore's SSD reads, as ``plan`` counts them per layer (a plan of alike
        layers counts none per layer: its commands are split evenly)."""
        if plan.num_commands:
            n = len(self.stored)
            self.read(np.asarray(plan.layer_commands, dtype=np.int64) if plan.layer_commands
                      else np.full(n, plan.num_commands // n))

    def read(self, per_layer: np.ndarray) -> None:
        """A restore's SSD read commands, per stored layer."""
        self.restores += 1
        self.commands[self.stored] += per_layer

    def metrics(self) -> dict[str, Any]:
        g = self.geometry
        written = g.kind_bytes(self.written.tolist())
        whole = self.sizes * self.blocks_written
        held = np.zeros_like(whole)
        held[self.stored] = whole[self.stored]
        cmds = g.kind_bytes(self.commands.tolist())
        per = max(self.restores, 1)
        return {
            "ssd_written_bytes_by_kind": written,
            "ssd_saved_by_windows_bytes": int(held.sum()) - sum(written.values()),
            # The kinds the engine does not prefix-cache: not stored, it rebuilds them.
            "ssd_not_stored_bytes": int(whole.sum() - held.sum()),
            "restore_commands_by_kind": {k: v / per for k, v in cmds.items()},
        }


def direct_reads(geometry: KVGeometry, spec: NodeSpec) -> np.ndarray:
    """Commands and bytes of one block read straight into the GPU (a row each, a
    column per layer): one command per layer that keeps every block and GPU of the
    worker, each its share of the layer's block widened to 4 KiB (O_DIRECT). A layer
    with a sliding window reads nothing: vLLM does not prefix-cache DeepSeek-V4's
    sliding-window state (``CircularBufferSpec.prefix_cacheable`` is False) and pads a
    sliding group's out-of-window blocks with null blocks (``kv_connector/v1/base.py``),
    so a per-layer reader gets none of them; the engine rebuilds the window by
    recomputation, which the replay charges no system."""
    gpw = spec.gpus_per_worker
    windows = geometry.layer_window_blocks or (0,) * geometry.num_layers
    out = np.zeros((2, geometry.num_layers), dtype=np.int64)
    for k, (size, w) in enumerate(zip(geometry.layer_block_bytes, windows, strict=True)):
        if not w:
            out[0, k] = gpw
            out[1, k] = gpw * spec.ssd.aligned(-(-size // gpw))
    return out
