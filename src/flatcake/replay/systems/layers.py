"""Per layer kind: what a system writes and reads of each kind of layer.

A model's layers may differ (``geometry.LayerGroup``: DeepSeek-V4-Flash's sliding-window,
c4a and c128a layers); every count here is per layer and summed per kind
(``KVGeometry.kind_bytes``), as ``flatcake inspect`` counts a store's files:

* ``LayerBooks``: the SSD bytes a store wrote per kind, what its windows saved against
  storing every block (a sliding-window layer keeps its segment's last ``window``
  blocks), and its read commands per restore per kind;
* ``direct_reads``: one block read straight into the GPU, one command per layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flatcake.geometry import KVGeometry
from flatcake.layout import SegmentLayout
from flatcake.readplan import ReadPlan
from flatcake.replay.node.devices import NodeSpec


class LayerBooks:
    """Bytes written and commands read, per layer, of one system on one node."""

    def __init__(self, geometry: KVGeometry) -> None:
        self.geometry = geometry
        n = geometry.num_layers
        self.sizes = np.asarray(geometry.layer_block_bytes, dtype=np.int64)
        self.written = np.zeros(n, dtype=np.int64)  # SSD bytes stored, per layer
        self.blocks_written = 0
        self.commands = np.zeros(n, dtype=np.int64)  # SSD read commands, per layer
        self.restores = 0  # restores that read the SSD

    def wrote(self, layout: SegmentLayout) -> None:
        """An SSD segment written."""
        self.blocks_written += layout.num_blocks
        self.written += [layout.layer_bytes(k) for k in range(len(self.written))]

    def read_plan(self, plan: ReadPlan) -> None:
        """A restore's SSD reads, as ``plan`` counts them per layer (a plan of alike
        layers counts none per layer: its commands are split evenly)."""
        if plan.num_commands:
            self.read(np.asarray(plan.layer_commands, dtype=np.int64) if plan.layer_commands
                      else np.full(len(self.commands), plan.num_commands // len(self.commands)))

    def read(self, per_layer: np.ndarray) -> None:
        """A restore's SSD read commands, per layer."""
        self.restores += 1
        self.commands += per_layer

    def metrics(self) -> dict[str, Any]:
        g = self.geometry
        written = g.kind_bytes(self.written.tolist())
        whole = g.kind_bytes((self.sizes * self.blocks_written).tolist())
        cmds = g.kind_bytes(self.commands.tolist())
        per = max(self.restores, 1)
        return {
            "ssd_written_bytes_by_kind": written,
            "ssd_saved_by_windows_bytes": sum(whole.values()) - sum(written.values()),
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
