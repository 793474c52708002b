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
* ``direct_reads``: one block read straight into the GPU, one command per layer;
* ``PeerBlocks``: what a baseline stores and reads of a block when the engine
  prefix-caches a sliding window, by vLLM's rule (every block) or SGLang's (one
  trailing window per request, ``windows.py``).
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
from flatcake.replay.systems.settings import WINDOW_RULES


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


def cached_window_layers(geometry: KVGeometry, uncached_kinds: Sequence[str]) -> np.ndarray:
    """Which layers have a sliding window the engine prefix-caches (a mask, in layer
    order): those with a window whose kind is not in ``uncached_kinds``."""
    windows = geometry.layer_window_blocks or (0,) * geometry.num_layers
    kinds = [grp.kind for grp in geometry.layer_groups for _ in range(grp.num_layers)]
    return np.array([bool(w) and kind not in uncached_kinds
                     for w, kind in zip(windows, kinds, strict=True)], dtype=bool)


def _direct(geometry: KVGeometry, spec: NodeSpec, layers: np.ndarray) -> np.ndarray:
    gpw = spec.gpus_per_worker
    out = np.zeros((2, geometry.num_layers), dtype=np.int64)
    for k, size in enumerate(geometry.layer_block_bytes):
        if layers[k]:
            out[0, k] = gpw
            out[1, k] = gpw * spec.ssd.aligned(-(-size // gpw))
    return out


def direct_reads(geometry: KVGeometry, spec: NodeSpec) -> np.ndarray:
    """Commands and bytes of one block read straight into the GPU (a row each, a
    column per layer): one command per layer that keeps every block and GPU of the
    worker, each its share of the layer's block widened to 4 KiB (O_DIRECT). A
    sliding-window layer is read for the window blocks at a hit's end only
    (``PeerBlocks.window_direct``)."""
    windows = geometry.layer_window_blocks or (0,) * geometry.num_layers
    return _direct(geometry, spec, np.array([not w for w in windows], dtype=bool))


@dataclasses.dataclass(frozen=True)
class PeerBlocks:
    """What a per-block baseline store holds and reads of one block when the engine
    prefix-caches some sliding windows (``NodeSpec.uncached_kinds`` leaves them out),
    by the rule of the engine the baseline models (``rule``).

    ``vllm`` (``tiered-direct``: Mooncake read straight into vLLM's paged KV): vLLM
    0.32's OffloadingConnector offloads every prefix-cacheable group
    (``kv_connector/v1/offloading/config.py: get_offloading_group_ids`` returns
    ``prefix_cacheable_group_ids``), a sliding-window group's blocks by the mask of
    ``SlidingWindowManager.reachable_block_mask`` (``v1/core/single_type_kv_cache_manager.py``):
    with the default ``retention_interval=None`` it keeps the window's tail at every
    chunk boundary, and a window no shorter than a chunk makes that every block ("Every
    block is reachable; cache them all"); its MooncakeStore connector stores by the
    same mask (``kv_connector/v1/mooncake/store/coordinator.py`` reuses
    ``reachable_block_mask``). So the store holds each block's windowed layers beside
    its other layers, and the window blocks at any hit's end are there whenever the
    hit's blocks are: the rule "a hit needs the window at its end" never cuts a
    baseline's hit back. A load reads a sliding group's last
    ``load_window_size_in_chunks`` keys only (``offloading/scheduler.py``:
    ``offload_keys[-sliding_window_size_in_chunks:]``): ``window_blocks`` blocks of the
    windowed layers at the hit's end, every block of the others.

    ``sglang`` (``tiered``, ``tiered-wait``, ``tiered-timeout``, ``tiered-uring``,
    ``memory-only``: SGLang HiCache over Mooncake Store): SGLang 0.5.23 keeps one
    trailing window per request, a load reads the window at the hit's end, and a hit
    whose trailing window is not held is cut back (``windows.TrailingWindows``, with
    its sources). A block then holds only the layers that keep every block; the last
    ``window_blocks`` blocks of each finished request hold ``window_bytes`` more.

    ``block_bytes``: bytes a store holds per block (the layers that keep every block,
    and the cached windowed layers under ``vllm``); ``window_bytes``: the windowed
    layers' bytes of one block; ``window_direct``: one window block's direct reads (as
    ``direct_reads``)."""

    block_bytes: int
    window_bytes: int
    window_blocks: int
    window_direct: np.ndarray
    rule: str = "vllm"

    @property
    def every_block(self) -> bool:
        """Whether every block holds its windowed layers (``vllm``)."""
        return self.rule == "vllm"

    @classmethod
    def of(cls, geometry: KVGeometry, spec: NodeSpec, rule: str = "vllm") -> PeerBlocks:
        if rule not in WINDOW_RULES:
            raise ValueError(f"invalid window rule {rule!r}: choose {' or '.join(WINDOW_RULES)}")
        cached = cached_window_layers(geometry, spec.uncached_kinds)
        sizes = np.asarray(geometry.layer_block_bytes, dtype=np.int64)
        windows = np.asarray(geometry.layer_window_blocks or (0,) * geometry.num_layers)
        win_bytes = int(sizes[cached].sum())
        per_block = win_bytes if rule == "vllm" else 0
        return cls(block_bytes=geometry.history_block_bytes + per_block,
                   window_bytes=win_bytes,
                   window_blocks=int(windows[cached].max()) if cached.any() else 0,
                   window_direct=_direct(geometry, spec, cached), rule=rule)
