"""FlatCake behind vLLM's KV connector API (V1 connector of vLLM 0.32).

Turn it on with one flag (vLLM's own prefix cache stays on; FlatCake loads what lies
beyond its hits)::

    vllm serve MODEL --kv-transfer-config '{
      "kv_connector": "FlatCakeConnector",
      "kv_connector_module_path": "flatcake.connectors.vllm",
      "kv_role": "kv_both",
      "kv_connector_extra_config": {"store": {"root": "/nvme/flatcake"}}}'

``kv_connector_extra_config`` takes the configuration's own keys, the engine keys in
its ``[engine]`` section (``connectors.settings``). The two halves map onto FlatCake's cut::

    vLLM scheduler process                     vLLM worker (one per TP rank)
    FlatCakeConnector(role=SCHEDULER)          FlatCakeConnector(role=WORKER)
      = SchedulerSide (control plane)            = WorkerSide (data plane)
    get_num_new_matched_tokens  lookup         register_kv_caches   paged KV view
    update_state_after_alloc    plan loads     handle_preemptions   run the step's plan
                                               (a CPU's KV) or      (all of it before
                                               start_load_kv        the forward on a CPU)
    build_connector_meta        plan the       wait_for_layer_load  sync loads, per layer
      prompt's store ── StepPlan ────────────► wait_for_save        join sync loads, queue
                                                                    the step's writes
    update_connector_output ◄─ WorkerReport ─  get_finished / get_block_ids_with_load_errors
    request_finished            reply length   shutdown             drain the writer

Blocks move as opaque bytes per layer (the paged block's bytes, whatever the backend
keeps inside: the CPU backend stores K transposed); the geometry is read off the
engine's KV cache spec.

Keys: block ``i`` of a request is ``control.keys.engine_block_key(ns, block_hashes[i])``
(vLLM's own chained block hash, which covers tokens, multimodal inputs and LoRA) with
``ns = gva.keys.namespace_key(model, tenant_salt, request.cache_salt)``: the engine-wide
``tenant_salt`` and the request's ``cache_salt`` (OpenAI API field ``cache_salt``,
offline ``TokensPrompt(cache_salt=...)``) both name the tenant, so different salts never
share a block, in memory or on SSD, before or after a restart.

A turn's prompt is stored when it is computed: in the step that computes the rest of
the prompt the scheduler half places the prompt's new full blocks (turn number,
context length and previous reply length are known before the turn runs) and allocates
their address; after that step's forward pass the worker queues the write (a bounded
queue; a background thread gathers, writes and syncs). The address is published once
every worker reports the bytes durable; the request keeps its blocks until then. A
reply's blocks are stored as part of the next turn's prompt. No call is needed: a
process that exits drains its writes in ``shutdown`` (vLLM calls it when a worker
stops) or in an exit hook, for at most ``shutdown_drain_s`` (a worker process of vLLM's
multiprocessing executor: at most half of its exit grace, ``worker_grace_s``); what
cannot finish is never published (a torn segment fails its crc32 at the next start).
``flush(llm)`` is an optional helper that also publishes them in the running process.

Sessions come from ``kv_transfer_params={"session_id": ...}`` (in the OpenAI API, the
request body's ``kv_transfer_params``; offline, ``SamplingParams(extra_args=
{"kv_transfer_params": ...})``), otherwise they are inferred (``control.signals``).
Each output's ``kv_transfer_params["flatcake"]`` says what FlatCake did for it.

Metrics go through vLLM's connector stats (``connectors.vllm_metrics``): logged with
the engine's stats, and on ``/metrics`` as ``vllm:flatcake_*``. KV cache events
(``BlockStored``/``BlockRemoved``, media ``CPU``/``STORAGE``) go out with vLLM's own
when ``--kv-events-config`` enables them (``connectors.vllm_events``).

In a cluster (``{"store": {"node_id": 1, "cluster_url": "redis://10.0.0.5:6379/0"}}``,
the keys of ``flatcake node`` and ``FlatCakeStore``) the worker joins the cluster index
as ``node_id``, serves its host arena and session files to the other nodes through NIXL
and publishes each segment once durable; the scheduler counts the blocks other nodes
hold after its own prefix (one batched lookup, each Redis call bounded; Redis down =
local-only and a warning); the worker reads them through the remote readers, each
layer's crc32 checked, and a block it cannot fetch (owner gone, timed out, bad crc) is a
load error: the engine recomputes it.

One store per machine (``{"store": {"node": "unix:/run/flatcake/node.sock"}}``, the
socket of ``flatcake serve``): the scheduler half forwards its calls to the node service
(``connectors.node_client``) and the worker runs the same plans on the service's files
and shared arena, so every DP rank and every vLLM on the machine shares one store. With
``store.cluster_url`` in the service's configuration the service is the node's member of
the cluster (any tensor parallelism): it looks up after the local prefix and publishes,
and each worker reads its own part of other nodes' blocks (``cluster.readers``).

Tensor parallelism: embedded, each rank keeps its own store directory
(``<root>/tp<rank>``). Attached to a node service, a block is one entry in the service's
books, its rank parts at the same offsets of one file per part; an MLA model's latent,
the same on every rank, is one part: written by rank 0, read by every rank
(``link.wire.TensorRanks``).

Models of several KV cache groups (vLLM's hybrid KV cache manager, e.g. sliding-window
and full-attention layers): the connector is ``SupportsHMA``; each prefix-cacheable
group is one ``LayerGroup`` of the geometry, its blocks taken from its own block list
(``connectors.group_slots``); every load is async, and a failed one is reported by
request (vLLM takes no block ids of several groups), so the engine recomputes it.

Models with recurrent state layers (Mamba-2, Gated DeltaNet: Qwen3-Next, Qwen3.5) with
vLLM's prefix cache on (``mamba_cache_mode = "align"``): each state layer is a
``geometry.LayerGroup.state`` of the state's arrays (``group_slots.EnginePages.content``:
the head of vLLM's padded page). vLLM frees a request's interior states as it goes, so a
state is stored from the block vLLM names for its checkpoint
(``boundary_state_offloads``, ``connectors.state_checkpoints``), never by position; a
segment whose end state it did not name (or freed) is not stored. A hit loads the
attention blocks and the state at its end together, the state into the block vLLM reads
an external hit's state from (the state group's block at the hit's last block).

Both kinds of models of several KV cache groups are served embedded and attached to a
node service alike: attached, the engine's geometry (every group's ``LayerGroup``) is
the one the service serves, checked at attach (another is refused naming both), and
the service's half plans every load async (``async_loads`` of the attach), as embedded.

Limits: a state vLLM does not checkpoint (``mamba_cache_mode`` other than ``align``:
its prefix cache off) is refused at start, naming its group, first layer and spec; no
pipeline parallelism; tensor parallelism in a cluster only attached to a node service
(embedded, each rank's arena and files would need a node id of their own); a node
service in a cluster refuses a geometry with windows or states (sliding-window,
recurrent state layers: remote reads do not serve them yet, ``service.cluster``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from flatcake.config import FlatCakeConfig
from flatcake.connectors.base import SchedulerHalf
from flatcake.connectors.group_slots import GroupIds, StepSlots, slots_of
from flatcake.connectors.requests import RequestKeys
from flatcake.connectors.scheduler_side import COUNTER_KEYS, RequestView, SchedulerSide
from flatcake.connectors.settings import IN_STEP_LINE, parse_extra_config
from flatcake.connectors.state_checkpoints import state_checkpoints, with_states
from flatcake.connectors.vllm_events import EventBook
from flatcake.connectors.vllm_glue import (
    FlatCakeMetadata,
    FlatCakeWorkerMetadata,
    KVGroups,
    engine_geometry,
    flush,
    group_tensors,
    layer_order,
    replicated_kv,
    worker_grace_s,
)
from flatcake.connectors.vllm_metrics import FlatCakePromMetrics, FlatCakeStats
from flatcake.connectors.worker_side import WorkerSide
from flatcake.layout import describe_layers
from flatcake.plan.tasks import WorkerReport

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_events import KVCacheEvent
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

    from flatcake.link.wire import TensorRanks

# Under vLLM's logger, so these lines land in the engine's log with its format.
logger = logging.getLogger("vllm.flatcake")


class FlatCakeConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM's V1 KV connector over FlatCake (see the module docstring)."""

    _cache_hit_source = CacheHitSource.DISK

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig | None = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        if kv_cache_config is None:
            raise ValueError("FlatCakeConnector needs the engine's kv_cache_config")
        if self._kv_transfer_config.kv_load_failure_policy != "recompute":
            # A block FlatCake could not deliver intact (torn, corrupt, unreadable) is a
            # miss: the engine recomputes it. vLLM's default would fail the request.
            logger.info("FlatCakeConnector sets kv_load_failure_policy='recompute' (was %r)",
                        self._kv_transfer_config.kv_load_failure_policy)
            self._kv_transfer_config.kv_load_failure_policy = "recompute"
        extra = self._kv_transfer_config.kv_connector_extra_config
        self.config: FlatCakeConfig = parse_extra_config(
            extra if isinstance(extra, Mapping) else None)
        parallel = vllm_config.parallel_config
        if parallel.pipeline_parallel_size != 1:
            raise ValueError(f"FlatCakeConnector does not support pipeline parallelism "
                             f"(pipeline_parallel_size={parallel.pipeline_parallel_size})")
        self.geometry = engine_geometry(vllm_config, kv_cache_config)
        # Several KV cache groups (the hybrid KV cache manager): each its own block list.
        self.kv_groups = (KVGroups.of(kv_cache_config)
                          if len(kv_cache_config.kv_cache_groups) > 1 else None)
        self._states = state_checkpoints(kv_cache_config, self.kv_groups)
        self._load_slots: dict[str, GroupIds] = {}
        self._store_slots: dict[str, GroupIds] = {}
        self.block_size = self.geometry.tokens_per_block
        hash_block = getattr(kv_cache_config, "hash_block_size", None) or self.block_size
        if self.block_size % hash_block:
            raise ValueError(f"block_size={self.block_size} is not a multiple of the engine's "
                             f"hash block size {hash_block}")
        self._hashes_per_block = self.block_size // hash_block
        self._world_size = int(parallel.tensor_parallel_size)
        if self.config.store.cluster_url and self._world_size != 1 \
                and not self.config.store.node:
            raise ValueError(
                f"FlatCakeConnector: store.cluster_url with tensor_parallel_size="
                f"{self._world_size}: each rank keeps its own arena and session files, and "
                "a node id per rank is not a design FlatCake has; attach the engine to a "
                "node service in the cluster (store.node; `flatcake serve` with "
                "store.cluster_url), run tensor_parallel_size=1, or leave "
                "store.cluster_url empty")
        root = Path(self.config.store.root).absolute()
        self.scheduler_side: SchedulerHalf | None = None
        self.worker_side: WorkerSide | None = None
        # Keys of twice the blocks the engine's cache holds are remembered (at most 128 Ki,
        # about 25 MiB): a prompt it serves from its prefix cache hashes nothing.
        self._keys = RequestKeys(self.geometry.name, self.config.engine.tenant_salt,
                                 self._hashes_per_block,
                                 min(max(1 << 12, 2 * int(kv_cache_config.num_blocks)), 1 << 17))
        # requests looked up whose prompt is not computed yet (scheduler side)
        self._awaiting_prompt: dict[str, Request] = {}
        events = vllm_config.kv_events_config
        groups = self.kv_groups
        self._events = (EventBook(self.block_size, () if groups is None else
                                  [groups.stored[i] for i in groups.layer_group])
                        if events is not None and events.enable_kv_cache_events else None)
        self._layer_index: dict[str, int] = {}
        self._invalid: set[int] = set()
        self._report = WorkerReport()
        self._start_before_forward = False  # set by register_kv_caches
        # KV in host memory (a CPU engine) that vLLM zeroes no new blocks of: a step's
        # loads start before its forward pass (``handle_preemptions``), and an SSD load
        # runs in the step that schedules its request (``SchedulerSide.ssd_in_step``).
        self._host_kv = (vllm_config.device_config.device_type == "cpu"
                         and not getattr(kv_cache_config, "needs_kv_cache_zeroing", False))
        node = self.config.store.node
        if role == KVConnectorRole.SCHEDULER and node:
            from flatcake.connectors.node_client import RemoteSchedulerSide

            dp = parallel.data_parallel_rank
            remote = RemoteSchedulerSide(
                self.geometry, self.config, ranks=self._tensor_ranks(vllm_config),
                name=f"vllm {vllm_config.model_config.served_model_name} dp{dp}",
                async_loads=self.kv_groups is not None)
            self.scheduler_side = remote
            logger.info("FlatCake scheduler side: attached to the node service %s as %r",
                        node, remote.engine_id or "(not yet)")
        elif role == KVConnectorRole.SCHEDULER:
            self.scheduler_side = SchedulerSide(self.geometry, self.config,
                                                self._rank_dir(root, 0),
                                                world_size=self._world_size,
                                                async_loads=self.kv_groups is not None,
                                                ssd_in_step=self._host_kv and
                                                self.config.engine.ssd_loads_in_step)
            logger.info("FlatCake scheduler side: store %s, %d segments recovered, geometry "
                        "%s blocks", root, self.scheduler_side.recovered_segments,
                        describe_layers(self.geometry.layer_block_bytes))
        if role == KVConnectorRole.SCHEDULER:
            self._log_in_step(bool(node))
        else:
            from vllm.distributed import get_tensor_model_parallel_rank

            rank = get_tensor_model_parallel_rank() if self._world_size > 1 else 0
            config, store_dir, arena = self.config, self._rank_dir(root, rank), None
            writes, part, parts = True, 0, 1
            if node:
                from flatcake.link.client import worker_root

                where = worker_root(node, config.store.node_timeout_s, rank, self.geometry,
                                    self._tensor_ranks(vllm_config),
                                    group=config.store.node_socket_group)
                config, store_dir, arena = where.config, where.store_dir, where.arena_path
                writes, part, parts = where.writes, where.part, where.parts
            drain_s = self.config.engine.drain_within(worker_grace_s(vllm_config))
            if drain_s < self.config.engine.shutdown_drain_s:
                logger.info("FlatCake drains its writes for at most %.1f s at shutdown: "
                            "half of VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (shutdown_drain_s "
                            "%.1f)", drain_s, self.config.engine.shutdown_drain_s)
            self.worker_side = WorkerSide(
                self.geometry, config, store_dir,
                max_pending_stores=self.config.engine.max_pending_stores,
                drain_timeout_s=drain_s, arena_path=arena, writes=writes, part=part,
                parts=parts, load_timeout_s=self.config.engine.in_step_load_timeout_s,
                async_load_timeout_s=self.config.engine.async_load_timeout_s)

    def _log_in_step(self, attached: bool) -> None:
        """One line at start: whether an SSD hit loads in the step that schedules it
        (``SchedulerSide.ssd_in_step``), and why."""
        side = self.scheduler_side
        in_step = side is not None and side.ssd_in_step
        why = ("attached to a node service: its loads are async" if attached
               else "the KV cache is not in host memory" if not self._host_kv
               else "ssd_loads_in_step is false" if not self.config.engine.ssd_loads_in_step
               else "several KV cache groups: every load is async" if not in_step
               else f"a host-memory KV cache; in_step_load_timeout_s "
                    f"{self.config.engine.in_step_load_timeout_s:g}")
        logger.info(IN_STEP_LINE, in_step, why)

    def _tensor_ranks(self, vllm_config: VllmConfig) -> TensorRanks:
        from flatcake.link.wire import TensorRanks

        return TensorRanks(self._world_size, replicated_kv(vllm_config, self._kv_cache_config))

    def _rank_dir(self, root: Path, rank: int) -> Path:
        return root if self._world_size == 1 else root / f"tp{rank}"

    def _sched(self) -> SchedulerHalf:
        if self.scheduler_side is None:
            raise RuntimeError("scheduler-side method called on a worker-side connector")
        return self.scheduler_side

    def _work(self) -> WorkerSide:
        if self.worker_side is None:
            raise RuntimeError("worker-side method called on a scheduler-side connector")
        return self.worker_side

    # -- scheduler side --------------------------------------------------------------

    def _engine_hash(self, request: Request, block: int) -> bytes:
        return self._keys.engine_hash(request, block)

    def _view(self, request: Request) -> RequestView:
        params = request.kv_transfer_params
        session = params.get("session_id") if isinstance(params, Mapping) else None
        return RequestView(request.request_id, self._keys.keys(request),
                           int(request.num_tokens), int(request.num_prompt_tokens),
                           int(request.num_output_tokens), int(request.num_computed_tokens),
                           session)

    def on_new_request(self, request: Request) -> None:
        self._sched().new_request(self._view(request))

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int
                                   ) -> tuple[int | None, bool]:
        if request.num_computed_tokens < request.num_prompt_tokens:
            self._awaiting_prompt[request.request_id] = request
        return self._sched().num_matched_tokens(self._view(request), num_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        if num_external_tokens <= 0:
            return
        per_group = blocks.get_block_ids()
        if self.kv_groups is not None:
            self._load_slots[request.request_id] = slots_of(
                per_group, self.kv_groups.stored, per_block=self.kv_groups.per_block)
        self._sched().after_alloc(request.request_id, per_group[self._first_group],
                                  num_external_tokens)

    def get_external_cache_hit_sources(self, request: Request, num_external_tokens: int
                                       ) -> dict[CacheHitSource, int]:
        mem, ssd = self._sched().hit_sources(request.request_id)
        if mem + ssd != num_external_tokens:
            return super().get_external_cache_hit_sources(request, num_external_tokens)
        out = {CacheHitSource.HOST: mem, CacheHitSource.DISK: ssd}
        return {k: v for k, v in out.items() if v}

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        sched = self._sched()
        if self._states is not None:
            block_state = scheduler_output.kv_connector_block_state
            self._states.offered(block_state.boundary_state_offloads
                                 if block_state is not None else None)
        computed: dict[str, tuple[Request, RequestView, tuple[list[int], ...]]] = {}
        for rid, num_tokens in scheduler_output.num_scheduled_tokens.items():
            request = self._awaiting_prompt.get(rid)
            if request is None or (request.num_computed_tokens + num_tokens
                                   < request.num_prompt_tokens):
                continue
            # This step computes the rest of the prompt: its new full blocks are written
            # after the forward pass (planned with the step, in one call).
            del self._awaiting_prompt[rid]
            computed[rid] = (request, self._view(request), self._block_ids(rid))
        preempted = scheduler_output.preempted_req_ids or ()
        for rid in preempted:  # computed again from scratch when resumed
            self._awaiting_prompt.pop(rid, None)
        if self._states is not None:
            self._states.forget(preempted)
        first_group = self._first_group
        step = sched.build_step(tuple(preempted), [(view, per_group[first_group])
                                                   for _, view, per_group in computed.values()])
        for task in step.stores:
            plan, got = task.plan, computed.get(task.request_id)
            if got is None:
                continue
            request, view, per_group = got
            first, n = plan.first_block, plan.segment.num_blocks
            if self.kv_groups is not None:
                ids = slots_of(per_group, self.kv_groups.stored, first, first + n,
                               self.kv_groups.per_block)
                states = self._states
                if states is not None:  # each state from the block vLLM named for it
                    holds = {g: set(per_group[g]) for g in states.groups}
                    ids = with_states(ids, self.kv_groups.stored, dict(zip(
                        states.groups, states.slots(task.request_id, first, first + n, holds),
                        strict=True)))
                self._store_slots[task.request_id] = ids
            if self._events is not None:
                bs = self.block_size
                self._events.planned(
                    view.keys[first:first + n],
                    [self._engine_hash(request, i) for i in range(first, first + n)],
                    self._engine_hash(request, first - 1) if first else None,
                    request.all_token_ids[first * bs:(first + n) * bs])
        if self.kv_groups is None:
            return FlatCakeMetadata(step)
        slots = StepSlots({t.request_id: self._load_slots.pop(t.request_id)
                           for t in step.loads},
                          {t.request_id: self._store_slots.pop(t.request_id)
                           for t in step.stores if t.plan.home is None})
        return FlatCakeMetadata(step, slots)

    @property
    def _first_group(self) -> int:
        """The vLLM group whose block ids the scheduler half plans with."""
        return 0 if self.kv_groups is None else self.kv_groups.plan_group

    def _block_ids(self, request_id: str) -> tuple[list[int], ...]:
        if self._kv_cache_manager is None:
            raise RuntimeError("FlatCakeConnector: vLLM did not bind its KV cache manager")
        return tuple(list(ids) for ids in self._kv_cache_manager.get_block_ids(request_id))

    def has_pending_push_work(self) -> bool:
        # Keeps a serving engine stepping until every store is reported and published.
        return self._sched().has_pending_stores()

    def take_events(self) -> Iterable[KVCacheEvent]:
        events = self._sched().take_events()
        if self._events is None or not events:
            return ()
        return self._events.convert(events)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        sched = self._sched()
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, FlatCakeWorkerMetadata):
            sched.on_report(meta.report)
        # The engine schedules the restored requests FC-MAS's ready queue released.
        released = sched.take_released(connector_output.finished_recving or ())
        connector_output.finished_recving = set(released) or None

    def request_finished_all_groups(self, request: Request, block_ids: tuple[list[int], ...]
                                    ) -> tuple[bool, dict[str, Any] | None]:
        # The blocks of every group stay until the worker reports the request's store.
        return self.request_finished(request, block_ids[self._first_group])

    def request_finished(self, request: Request, block_ids: list[int]
                         ) -> tuple[bool, dict[str, Any] | None]:
        view = self._view(request)
        self._keys.forget(request.request_id)
        if self._states is not None:
            self._states.forget([request.request_id])
        self._awaiting_prompt.pop(request.request_id, None)
        return self._sched().request_finished(view)

    def pending_stores(self) -> int:
        """Turn segments planned and not yet reported durable (scheduler side)."""
        return self._sched().num_pending_stores()

    # -- worker side -----------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        first = next(iter(kv_caches.values()))
        first = first[0] if isinstance(first, (list, tuple)) else first
        self._start_before_forward = self._host_kv and first.device.type == "cpu"
        if self.kv_groups is not None:
            # Layers of different groups share one buffer (their blocks differ): one
            # tensor per layer of a stored group, in FlatCake's layer order.
            groups = self.kv_groups
            self._layer_index = {name: i for i, name in enumerate(groups.layers)}
            self._work().register(group_tensors(groups, kv_caches), groups.layer_group,
                                  pages=groups.pages)
            logger.info("FlatCake worker side: %d KV layers in %d KV cache groups, store %s",
                        len(groups.layers), len(groups.stored), self._work().store_dir)
            return
        order = sorted(kv_caches, key=layer_order)
        tensors: list[torch.Tensor] = []
        by_ptr: dict[int, int] = {}
        for name in order:
            t = kv_caches[name]
            idx = by_ptr.setdefault(t.data_ptr(), len(tensors))
            if idx == len(tensors):
                tensors.append(t)
            self._layer_index[name] = idx
        self._work().register(tensors)
        logger.info("FlatCake worker side: %d KV layers of shape %s, store %s",
                    len(tensors), tuple(tensors[0].shape), self._work().store_dir)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        # vLLM's first call of a step, before its forward pass. A preempted request's
        # blocks may be overwritten by this forward: its stores finish first. On a CPU
        # the whole step starts here: vLLM starts async loads after the forward, which
        # costs nothing where the forward is only launched (a GPU) but on a CPU delays
        # an SSD restore by a whole forward pass, and its report by a step. Nothing in
        # flight touches this step's blocks on a CPU (the last forward has returned),
        # unless vLLM zeroes newly allocated blocks in this step (Mamba, mixed
        # precision), which a load started earlier would lose.
        if not isinstance(kv_connector_metadata, FlatCakeMetadata):
            return
        if self._start_before_forward:
            self._work().start_step(kv_connector_metadata.plan, kv_connector_metadata.slots)
        else:
            self._work().wait_for_stores(kv_connector_metadata.plan.preempted)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if isinstance(meta, FlatCakeMetadata):  # a no-op when handle_preemptions ran it
            self._work().start_step(meta.plan, meta.slots)

    def wait_for_layer_load(self, layer_name: str) -> None:
        idx = self._layer_index.get(layer_name)
        if idx is not None:
            self._work().wait_for_layer(idx)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: AttentionMetadata, **kwargs: Any) -> None:
        # A turn's prompt is stored whole after the forward pass that computed it: the
        # writer gathers each layer of its blocks into one layer-major segment (one
        # write per turn, not per layer), from blocks the request keeps until durable.
        return

    def wait_for_save(self) -> None:
        # Joins this step's sync loads and queues the writes of the prompts it computed.
        self._work().end_step()

    def get_finished(self, finished_req_ids: set[str]
                     ) -> tuple[set[str] | None, set[str] | None]:
        sending, recving, invalid, report = self._work().poll(finished_req_ids)
        self._invalid |= invalid
        self._report = self._report.merged(report)
        return sending or None, recving or None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        sending, recving = self.get_finished(finished_req_ids)
        failed = self._work().take_failed_requests() if self.kv_groups is not None else set()
        return KVConnectorTransferResults(set(sending or ()), set(recving or ()), failed)

    def get_block_ids_with_load_errors(self) -> set[int]:
        out, self._invalid = self._invalid, set()
        # vLLM cannot map block ids of several groups back to requests: a failed load
        # is reported by request (``get_transfer_results``) and recomputed whole.
        return out if self.kv_groups is None else set()

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        if self._report.is_empty():
            return None
        report, self._report = self._report, WorkerReport()
        return FlatCakeWorkerMetadata(report)

    def shutdown(self) -> None:
        if self.worker_side is not None:
            started = time.monotonic()
            self.worker_side.close()
            logger.info("FlatCake worker side closed in %.2f s (writes drained for at most "
                        "%.1f s)", time.monotonic() - started, self.worker_side.drain_timeout_s)
        if self.scheduler_side is not None:
            self.scheduler_side.close()

    # -- metrics ---------------------------------------------------------------------

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        if self.scheduler_side is not None:
            data: dict[str, Any] = dict(self.scheduler_side.take_stats())
        else:
            data = dict(self._work().take_stats())
        stats = FlatCakeStats(data=data)
        return None if stats.is_empty() and not data else stats

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None
                                 ) -> KVConnectorStats | None:
        return FlatCakeStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: VllmConfig, metric_types: Any,
                           labelnames: list[str],
                           per_engine_labelvalues: dict[int, list[object]]
                           ) -> KVConnectorPromMetrics | None:
        return FlatCakePromMetrics(vllm_config, metric_types, labelnames,
                                   per_engine_labelvalues)


__all__ = ["COUNTER_KEYS", "FlatCakeConnector", "FlatCakePromMetrics", "FlatCakeStats",
           "flush"]
