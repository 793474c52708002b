"""vLLM glue of the FlatCake connector (``connectors.vllm``): the step metadata both
halves exchange, the engine's KV geometry and its KV cache groups, the layer order of its
KV caches, whether its tensor-parallel ranks hold the same KV, and the optional ``flush``
helper for an in-process offline engine."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

from flatcake.connectors.group_slots import EnginePages, StepSlots
from flatcake.geometry import DTYPE_BYTES, KVGeometry, LayerGroup
from flatcake.plan.tasks import StepPlan, WorkerReport

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig


class FlatCakeMetadata(KVConnectorMetadata):
    """Scheduler -> worker, once per step: the step's loads, stores and file drops, and
    (several KV cache groups) their blocks in every group."""

    def __init__(self, plan: StepPlan, slots: StepSlots | None = None) -> None:
        self.plan = plan
        self.slots = slots


class FlatCakeWorkerMetadata(KVConnectorWorkerMetadata):
    """Worker -> scheduler, once per step: the tasks that finished."""

    def __init__(self, report: WorkerReport) -> None:
        self.report = report

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        if not isinstance(other, FlatCakeWorkerMetadata):
            raise TypeError(f"cannot aggregate FlatCake metadata with {type(other).__name__}")
        return FlatCakeWorkerMetadata(self.report.merged(other.report))


SERVED_SPECS = ("FullAttentionSpec", "MLAAttentionSpec", "SinkFullAttentionSpec",
                "SlidingWindowSpec", "SlidingWindowMLASpec", "ChunkedLocalAttentionSpec")
"""KV cache specs whose pages hold one block's KV (or compressed states) of one attention
layer: stored as opaque bytes (a sliding-window or chunked-local layer alone in its
group is stored like a full one); a ``UniformTypeKVCacheSpecs`` group of these, each
layer its own."""


def _spec_kind(spec: Any) -> str:
    """One layer's KV cache spec for a message: class, page size, window, tokens per
    state (a compressed layer)."""
    window = getattr(spec, "sliding_window", None)
    per_state = getattr(spec, "__dict__", {}).get("tokens_per_state", 1)
    extra = (f", window {window} tokens" if window else "") + \
        (f", one state per {per_state} tokens" if isinstance(per_state, int)
         and per_state > 1 else "") + _state_kind(spec)
    return f"{type(spec).__name__} ({getattr(spec, 'page_size_bytes', '?')} B pages{extra})"


def _state_kind(spec: Any) -> str:
    """A recurrent state's arrays (vLLM's ``MambaSpec``: conv and SSM state) for a
    message: each shape and dtype, and the cache mode; empty for any other spec."""
    shapes = getattr(spec, "shapes", None)
    if not shapes:
        return ""
    dtypes = [str(d).removeprefix("torch.") for d in getattr(spec, "dtypes", ())]
    arrays = ", ".join(f"{'x'.join(map(str, shape))} {dtype}"
                       for shape, dtype in zip(shapes, dtypes, strict=False))
    mode = getattr(spec, "mamba_cache_mode", None)
    return f", state {arrays}" + (f", mamba_cache_mode {mode}" if mode else "")


def group_kind(group: Any) -> str:
    """One KV cache group for a message: its layer count and spec class, and the layer
    kinds a ``UniformTypeKVCacheSpecs`` group holds (DeepSeek-V4 packs an MLA layer, its
    indexer and layers of other compression ratios into one)."""
    spec = group.kv_cache_spec
    inner = getattr(spec, "kv_cache_specs", None)
    if not isinstance(inner, Mapping) or not inner:
        names = list(group.layer_names)
        first = f", layer {names[0]}" + (f" and {len(names) - 1} more" if len(names) > 1
                                          else "") if names else ""
        return f"{len(names)} layers of {_spec_kind(spec)}{first}"
    kinds = Counter(_spec_kind(layer) for layer in inner.values())
    held = "; ".join(f"{n} x {kind}" for kind, n in kinds.items())
    return (f"{len(group.layer_names)} layers of {type(spec).__name__} in "
            f"{spec.block_size}-token blocks: {held}")


def replayed_by_engine(spec: Any) -> bool:
    """A group vLLM rebuilds itself after a hit: its scheduler recomputes the hit's last
    window (``prefix_replay_tokens``, DeepSeek-V4.1's bounded replay of the sliding
    window, ``vllm/v1/core/sched/scheduler.py``) and a connector's load restores only
    the prefix-cacheable groups (``get_loaded_kv_cache_group_ids``,
    ``vllm/distributed/kv_transfer/kv_connector/v1/base.py``)."""
    return int(getattr(spec, "prefix_replay_tokens", 0) or 0) > 0


def _refusal(kv_cache_config: KVCacheConfig, problems: Sequence[str]) -> ValueError:
    groups = kv_cache_config.kv_cache_groups
    left = [str(g) for g, grp in enumerate(groups) if replayed_by_engine(grp.kv_cache_spec)]
    tail = (f"; group {', '.join(left)} left to vLLM's bounded window replay"
            if left else "")
    state = any(getattr(g.kv_cache_spec, "shapes", None) for g in groups)
    why = ("; a recurrent state (Mamba, Gated DeltaNet) is served beside attention "
           "layers as vLLM's prefix cache checkpoints it (mamba_cache_mode 'align': turn "
           "the prefix cache on), and restoring the attention blocks without it would "
           "serve wrong KV" if state else "")
    return ValueError(f"FlatCakeConnector cannot store {'; '.join(problems)}: it serves "
                      f"{', '.join(SERVED_SPECS)} (also side by side in a "
                      f"UniformTypeKVCacheSpecs group){why}{tail}")


def _layer_specs(group: Any) -> dict[str, Any]:
    """Each layer's own spec of a KV cache group (a ``UniformTypeKVCacheSpecs`` group
    holds one per layer, of different page sizes; any other, the group's)."""
    spec = group.kv_cache_spec
    inner = getattr(spec, "kv_cache_specs", None)
    if isinstance(inner, Mapping) and inner:
        return {name: inner[name] for name in group.layer_names}
    return {name: spec for name in group.layer_names}


def _served(group: Any) -> bool:
    return all(type(spec).__name__ in SERVED_SPECS for spec in _layer_specs(group).values())


@dataclass(frozen=True, slots=True)
class KVGroups:
    """The engine's KV cache groups as FlatCake stores them: ``stored`` (vLLM group
    indices), ``layers`` (the layer names in FlatCake's layer order: group by group,
    a group's layers of one page size together), ``layer_group`` (each layer's index
    into ``stored``), ``tokens_per_block`` (FlatCake's block: every stored group's block
    fits whole) and ``pages`` (each layer's engine blocks in one FlatCake block). A
    group vLLM replays itself after a hit (``replayed_by_engine``) is neither stored
    nor restored."""

    stored: tuple[int, ...]
    layers: tuple[str, ...]
    layer_group: tuple[int, ...]
    tokens_per_block: int = 0
    pages: tuple[EnginePages, ...] = ()
    layer_groups: tuple[LayerGroup, ...] = ()
    per_block: tuple[int, ...] = ()
    plan_group: int = 0

    @classmethod
    def of(cls, kv_cache_config: KVCacheConfig) -> KVGroups:
        """The engine's groups; a recurrent state group (``MambaSpec`` in ``align``
        mode) is a ``LayerGroup.state`` (``_state_layer``)."""
        groups = kv_cache_config.kv_cache_groups
        transfer = getattr(kv_cache_config, "transfer_group_ids", range(len(groups)))
        cacheable = getattr(kv_cache_config, "prefix_cacheable_group_ids", transfer)
        problems = []
        for g in transfer:
            spec = groups[g].kv_cache_spec
            if g not in cacheable and replayed_by_engine(spec):
                continue
            if g in cacheable and _state_group(groups[g]) and all(
                    getattr(spec, "mamba_cache_mode", None) == "align"
                    for spec in _layer_specs(groups[g]).values()):
                continue
            if not _served(groups[g]) or g not in cacheable:
                # Restoring the others without this group's state would serve wrong KV.
                problems.append(f"{'' if len(transfer) == 1 else f'group {g}, '}"
                                f"{group_kind(groups[g])}"
                                f"{'' if g in cacheable else ' (not prefix-cacheable)'}")
        if problems:
            raise _refusal(kv_cache_config, problems)
        stored = tuple(cacheable)
        tokens = math.lcm(*(int(groups[g].kv_cache_spec.block_size) for g in stored))
        names, layer_group, pages, kinds = [], [], [], []
        for i, g in enumerate(stored):
            specs = _layer_specs(groups[g])
            block = int(groups[g].kv_cache_spec.block_size)
            for name in sorted(specs, key=lambda n: (-int(specs[n].page_size_bytes),
                                                     layer_order(n))):
                page, kind = _layer_kind(specs[name], block, tokens)
                names.append(name)
                layer_group.append(i)
                pages.append(page)
                kinds.append(kind)
        merged: list[LayerGroup] = []
        for kind in kinds:
            if merged and replace(merged[-1], num_layers=1) == kind:
                merged[-1] = replace(merged[-1], num_layers=merged[-1].num_layers + 1)
            else:
                merged.append(kind)
        per_block = tuple(tokens // int(groups[g].kv_cache_spec.block_size) for g in stored)
        # A state group's block list is null but at its checkpoints: never planned with.
        whole = [g for g, k in zip(stored, per_block, strict=True)
                 if k == 1 and not _state_group(groups[g])]
        if not whole:
            raise _refusal(kv_cache_config, [
                f"groups of {', '.join(str(groups[g].kv_cache_spec.block_size) for g in stored)}"
                f"-token blocks (none of them {tokens} tokens, a block of every group)"])
        # The scheduler half plans with one block id per FlatCake block: a group of
        # FlatCake's block, one that keeps every block where there is one.
        plan = next((g for g in whole if not any(
            getattr(spec, "sliding_window", None)
            for spec in _layer_specs(groups[g]).values())), whole[0])
        return cls(stored, tuple(names), tuple(layer_group), tokens, tuple(pages),
                   tuple(merged), per_block, plan)


def group_tensors(kv: KVGroups, kv_caches: Mapping[str, Any]) -> list[Any]:
    """The engine's KV tensors of the stored layers, in FlatCake's layer order, each
    checked to hold its spec's page per block, blocks one after another (a state
    layer's arrays as one view of its pages: ``state_pages``); a layout
    FlatCake does not read is refused at start, naming the layer."""
    import torch

    from flatcake.cio.paged import PagedKV

    out = []
    for name, pages in zip(kv.layers, kv.pages, strict=True):
        t = kv_caches[name]
        if pages.content:
            t = state_pages(name, t if isinstance(t, (list, tuple)) else [t],
                            pages.page_bytes, pages.content)
        try:
            PagedKV([t], (pages.page_bytes,))
        except ValueError as exc:
            raise ValueError(
                f"FlatCakeConnector cannot read layer {name}'s KV blocks: vLLM laid them "
                f"out as shape {tuple(t.shape)}, stride {tuple(t.stride())}, {t.dtype}, "
                f"and FlatCake reads each layer's blocks as {pages.page_bytes} B pages "
                f"({exc}; a block-outermost KV cache layout packs several layers' pages "
                f"into each block, and DeepSeek-V4's backends ask for one)") from None
        out.append(t)
    if any(pages.content for pages in kv.pages):
        # Pages of a state and of attention alike, as bytes: one dtype and shape per size.
        out = [t if t.dtype == torch.uint8 and t.dim() == 2 else
               t.reshape(-1).view(torch.uint8).view(int(t.shape[0]), -1) for t in out]
    return out


def state_pages(name: str, states: Sequence[Any], page: int, content: int) -> Any:
    """A recurrent state layer's KV as one ``(num_blocks, page)`` uint8 view: vLLM views
    the state's arrays (conv state, SSM state; ``content`` bytes in all) into each
    ``page``-byte page one after another from its first byte, padding after
    (``MambaSpec.page_size_padded``). vLLM 0.32 hands a connector one byte view of them
    per layer (``(num_blocks, 1, 1, content)`` int8, page-strided); its model runner, one
    view per array. Any other layout is refused, naming the layer."""
    import torch

    first, at = states[0], 0
    for i, t in enumerate(states):
        if t.data_ptr() - first.data_ptr() != at or t.stride(0) * t.element_size() != page \
                or not t[0].is_contiguous() or t.shape[0] != first.shape[0]:
            raise ValueError(
                f"FlatCakeConnector cannot read layer {name}'s state pages: array {i} is "
                f"shape {tuple(t.shape)}, stride {tuple(t.stride())}, {t.dtype} at byte "
                f"{t.data_ptr() - first.data_ptr()} of the page; FlatCake reads each "
                f"block's arrays one after another from the start of its {page} B page")
        at += t[0].numel() * t.element_size()
    num_blocks = int(first.shape[0])
    offset = first.storage_offset() * first.element_size()
    if at != content or offset + num_blocks * page > first.untyped_storage().nbytes():
        raise ValueError(f"FlatCakeConnector: layer {name}'s {num_blocks} state pages of "
                         f"{page} B hold {at} B of arrays ({content} B expected) or "
                         f"overrun their buffer")
    raw = torch.empty(0, dtype=torch.uint8, device=first.device)
    return raw.set_(first.untyped_storage(), offset, (num_blocks, page), (page, 1))


def _state_group(group: Any) -> bool:
    """A group of recurrent states (vLLM's ``MambaSpec``: Mamba-2, Gated DeltaNet)."""
    return all(getattr(spec, "shapes", None) for spec in _layer_specs(group).values())


def _state_layer(spec: Any, block: int, tokens: int) -> tuple[EnginePages, LayerGroup]:
    """A recurrent state layer's pages and ``LayerGroup.state``: vLLM's ``align`` mode
    checkpoints the state at the end of each of its blocks into that block's page (the
    state's arrays first, padding to the attention page after); FlatCake keeps the
    arrays of the page at each FlatCake block's end (the last of its engine blocks)."""
    mode = getattr(spec, "mamba_cache_mode", None)
    if mode != "align":
        raise ValueError(f"FlatCakeConnector cannot store a recurrent state of "
                         f"{_spec_kind(spec)}: only mamba_cache_mode 'align' keeps a "
                         f"state at block boundaries (vLLM picks it with prefix caching)")
    dtypes = [str(d).removeprefix("torch.") for d in spec.dtypes]
    group = LayerGroup.state(1, spec.shapes, dtypes, tokens)
    page = int(spec.page_size_bytes)
    return EnginePages(page, tokens // block, 1, group.entry_bytes), group


def _layer_kind(spec: Any, block: int, tokens: int) -> tuple[EnginePages, LayerGroup]:
    """One layer's engine blocks in a FlatCake block of ``tokens`` tokens and its
    ``LayerGroup`` of one layer. A sliding-window layer whose window ends inside one
    FlatCake block keeps just the engine blocks the window reaches at the block's end:
    those vLLM keeps (``SlidingWindowManager.remove_skipped_blocks``,
    ``vllm/v1/core/single_type_kv_cache_manager.py``: from ``sliding_window - 1 +
    extra_retained_tokens`` tokens back)."""
    if getattr(spec, "shapes", None):
        return _state_layer(spec, block, tokens)
    page = int(spec.page_size_bytes)
    per_block = tokens // block
    window = int(getattr(spec, "sliding_window", None) or 0)
    per_state = getattr(spec, "__dict__", {}).get("tokens_per_state", 1)
    kind = "sliding" if window else (f"c{per_state}" if isinstance(per_state, int)
                                     and per_state > 1 else "full")
    reach = -(-(window - 1 + int(getattr(spec, "extra_retained_tokens", 0) or 0)) // block)
    if window and per_block > 1 and reach < per_block:
        kept = max(reach, 1)
        return (EnginePages(page, per_block, kept),
                LayerGroup(1, kept * page, tokens, min(window, tokens), kind))
    entry, per_entry = (page // block, 1) if page % block == 0 else (page, block)
    return (EnginePages(page, per_block, per_block),
            LayerGroup(1, entry, per_entry, window, kind))


def engine_geometry(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> KVGeometry:
    """The per-worker geometry of the engine's paged KV (one block of one layer is one
    page of the engine's KV cache spec; several KV cache groups: one ``LayerGroup``
    each, ``KVGroups`` order). A model kind FlatCake cannot serve is refused here, at
    start, with a message naming it."""
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        return _groups_geometry(str(vllm_config.model_config.model), kv_cache_config)
    spec = groups[0].kv_cache_spec
    if type(spec).__name__ not in SERVED_SPECS:
        raise _refusal(kv_cache_config, [group_kind(groups[0])])
    num_layers = len(groups[0].layer_names)
    block_size = int(spec.block_size)
    page = int(spec.page_size_bytes)
    name = str(vllm_config.model_config.model)
    dtype = str(getattr(spec, "dtype", "")).removeprefix("torch.")
    heads, head = int(getattr(spec, "num_kv_heads", 0)), int(getattr(spec, "head_size", 0))
    if dtype in DTYPE_BYTES and heads > 0 and head > 0:
        mla = "MLA" in type(spec).__name__
        g = KVGeometry(num_layers, block_size, 0 if mla else heads, 0 if mla else head,
                       dtype, head if mla else 0, name)
        if g.block_bytes_per_layer == page:
            return g
    if page % block_size:
        raise ValueError(f"KV page of {page} bytes does not split into {block_size} tokens")
    # Opaque bytes: whatever the page holds, one token's share of it per token.
    return KVGeometry(num_layers, block_size, dtype="uint8", mla_latent_dim=page // block_size,
                      name=name)


def replicated_kv(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> bool:
    """Whether every tensor-parallel rank holds the same KV bytes: MLA's latent (one per
    token, not split by heads) in every KV cache group, unless decode context
    parallelism splits it by token."""
    dcp = int(getattr(vllm_config.parallel_config, "decode_context_parallel_size", 1) or 1)
    return dcp == 1 and all(type(g.kv_cache_spec).__name__ == "MLAAttentionSpec"
                            for g in kv_cache_config.kv_cache_groups)


def worker_grace_s(vllm_config: VllmConfig) -> float | None:
    """Seconds a stopping engine gives each worker process to exit before it sends
    SIGTERM (``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS``; SIGKILL follows 4 s later): the
    multiprocessing executor's workers only (``None`` for a worker in the engine's own
    process, which nobody signals)."""
    if vllm_config.parallel_config.distributed_executor_backend != "mp":
        return None
    import vllm.envs as envs

    return float(envs.VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS)


def _groups_geometry(name: str, kv_cache_config: KVCacheConfig) -> KVGeometry:
    """The stored KV cache groups' layers (``KVGroups``), each with its own bytes per
    block and its own block in tokens, in a FlatCake block every group's fits whole."""
    kv = KVGroups.of(kv_cache_config)
    return KVGeometry(len(kv.layers), kv.tokens_per_block, dtype="uint8", name=name,
                      groups=kv.layer_groups)


def layer_order(name: str) -> tuple[int, str]:
    digits = [int(part) for part in name.split(".") if part.isdigit()]
    return (digits[0] if digits else -1, name)


def flush(llm: Any, timeout_s: float = 120.0) -> int:
    """Optional: step an in-process offline engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
    until every planned segment is durable *and published in this process*; returns the
    steps taken. Not needed for anything to be stored: writes finish in the background
    and at exit, and a later request of the same prefix waits for them."""
    core = llm.llm_engine.engine_core.engine_core
    connector = core.scheduler.get_kv_connector()
    if not callable(getattr(connector, "pending_stores", None)):
        raise ValueError("flush: the engine does not run FlatCakeConnector")
    deadline = time.monotonic() + timeout_s
    steps = 0
    while connector.pending_stores():
        if time.monotonic() > deadline:
            raise TimeoutError(f"flush: {connector.pending_stores()} stores still pending "
                               f"after {timeout_s} s")
        core.step_fn()
        steps += 1
        time.sleep(0.001)
    return steps
