"""Device models of the replay simulator: GPU compute and KV pool, host->GPU link, SSD,
Mooncake's staging buffer. Only these are models; the control plane driven by the simulator is the
real one.

Every constant lives in a frozen spec below, documented where it is defined; presets
(``replay.presets``) fill them in and name their sources. Units are in the names.

Timing models, all deterministic:

* **Prefill** of ``n`` new tokens on top of ``c`` cached tokens::

      t = overhead + n / prefill_tokens_per_s + attn_s_per_token_pair * n * (c + n / 2)

  The linear term is the weight FLOPs (MLP, projections); the quadratic term is
  attention, each new token attending to everything before it.
* **Decode** (continuous batching): one step of a batch of ``b`` sequences holding ``k``
  KV bytes takes ``decode_step_base_s + b * decode_step_per_seq_s + k / hbm_bytes_per_s``
  (weights are read once per step; every sequence's KV is read once per step). A request
  decoding ``m`` tokens takes ``m`` steps at the step time seen when it joins the batch.
* **SSD** reads and writes: a batch of ``n`` commands moving ``b`` bytes occupies one
  worker's SSD channel for ``b / bandwidth + n * command_latency_s / queue_depth``
  seconds, so with the same bytes, scattered small commands cost more than a few merged
  large ones (the per-command latency is only hidden ``queue_depth`` commands at a time).
  The channel serves jobs first come first served (``FifoServer``), so concurrent
  restores queue behind each other.
* **Host->GPU** copies: ``bytes / host_to_gpu_bytes_per_s`` on the worker's link, FIFO.
* **A load in the step** (``NodeSpec.ssd_loads_in_step``): the restore of ``L`` layers
  starts with the prefill and delivers its layers evenly over ``load_s``; the forward of
  layer ``i`` starts once layer ``i`` is loaded and layer ``i - 1`` computed
  (``layered_s``). Evenly spread, that is ``max(load, compute) + min(load, compute) / L``.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3
GB = 1e9
ROUTINGS: tuple[str, ...] = ("round_robin", "session", "prefix")


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"invalid replay device spec {name}={value!r}: must be > 0")


def _non_negative(name: str, value: float) -> None:
    if not value >= 0:
        raise ValueError(f"invalid replay device spec {name}={value!r}: must be >= 0")


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One worker (GPU): its KV pool and its compute speed.

    Attributes:
        kv_capacity_bytes: KV pool of the engine on this GPU (running requests plus the
            engine's own prefix cache, LRU).
        prefill_tokens_per_s: linear prefill throughput (tokens/s) at short context.
        attn_s_per_token_pair: attention cost per (new token, earlier token) pair.
        prefill_overhead_s: fixed cost of one prefill (launch, scheduling, sampling).
        decode_step_base_s: one decode step's fixed cost (reading the weights).
        decode_step_per_seq_s: extra cost per sequence in the batch.
        hbm_bytes_per_s: GPU memory bandwidth, for reading every sequence's KV per step.
        max_batch_seqs: most sequences decoding at once on this worker.
        prefill_s_per_cached_token: extra prefill cost per cached (not recomputed) token
            of the context, linear (a CPU engine measured by ``report.realcheck``; 0 where
            the pair term models attention).
    """

    kv_capacity_bytes: int
    prefill_tokens_per_s: float
    attn_s_per_token_pair: float
    prefill_overhead_s: float
    decode_step_base_s: float
    decode_step_per_seq_s: float
    hbm_bytes_per_s: float
    max_batch_seqs: int = 256
    prefill_s_per_cached_token: float = 0.0

    def __post_init__(self) -> None:
        _positive("gpu.kv_capacity_bytes", self.kv_capacity_bytes)
        _positive("gpu.prefill_tokens_per_s", self.prefill_tokens_per_s)
        _non_negative("gpu.attn_s_per_token_pair", self.attn_s_per_token_pair)
        _non_negative("gpu.prefill_overhead_s", self.prefill_overhead_s)
        _non_negative("gpu.decode_step_base_s", self.decode_step_base_s)
        _non_negative("gpu.decode_step_per_seq_s", self.decode_step_per_seq_s)
        _positive("gpu.hbm_bytes_per_s", self.hbm_bytes_per_s)
        _positive("gpu.max_batch_seqs", self.max_batch_seqs)
        _non_negative("gpu.prefill_s_per_cached_token", self.prefill_s_per_cached_token)

    def prefill_time_s(self, new_tokens: int, context_tokens: int) -> float:
        """Seconds to prefill ``new_tokens`` on top of ``context_tokens`` cached ones."""
        if new_tokens <= 0:
            return self.prefill_overhead_s
        attn = self.attn_s_per_token_pair * new_tokens * (context_tokens + new_tokens / 2)
        return (self.prefill_overhead_s + new_tokens / self.prefill_tokens_per_s + attn
                + context_tokens * self.prefill_s_per_cached_token)

    def decode_step_s(self, batch_seqs: int, batch_kv_bytes: float) -> float:
        """Seconds of one decode step of ``batch_seqs`` sequences holding that much KV."""
        return (self.decode_step_base_s + batch_seqs * self.decode_step_per_seq_s
                + batch_kv_bytes / self.hbm_bytes_per_s)


def layered_s(load_s: float, compute_s: float, layers: int, wait_s: float = 0.0) -> float:
    """Seconds until the last layer's forward ends when a load of ``layers`` layers
    taking ``load_s`` (each layer's part evenly, in layer order) starts at 0 and the
    forward of those layers takes ``compute_s``; the forward starts no earlier than
    ``wait_s`` (a decode step in progress) and each layer waits for its load."""
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers!r}")
    r, f = load_s / layers, compute_s / layers
    end = wait_s
    for i in range(1, layers + 1):
        end = max(end, i * r) + f
    return end


@dataclass(frozen=True, slots=True)
class SsdSpec:
    """The node's SSDs.

    Attributes:
        capacity_bytes: KV budget on SSD for the whole node (every system gets the same).
        read_bytes_per_s: sequential read bandwidth of one worker's SSD channel (the
            drives behind that GPU's PCIe switch).
        write_bytes_per_s: sequential write bandwidth of one worker's channel.
        command_latency_s: device latency of one read or write command.
        queue_depth: commands one channel keeps in flight; the latency of a batch of
            ``n`` commands is paid ``n / queue_depth`` times.
        align_bytes: O_DIRECT / GDS alignment; every command moves whole aligned units.
    """

    capacity_bytes: int
    read_bytes_per_s: float
    write_bytes_per_s: float
    command_latency_s: float
    queue_depth: int
    align_bytes: int = 4096

    def __post_init__(self) -> None:
        _non_negative("ssd.capacity_bytes", self.capacity_bytes)
        _positive("ssd.read_bytes_per_s", self.read_bytes_per_s)
        _positive("ssd.write_bytes_per_s", self.write_bytes_per_s)
        _non_negative("ssd.command_latency_s", self.command_latency_s)
        _positive("ssd.queue_depth", self.queue_depth)
        _positive("ssd.align_bytes", self.align_bytes)

    def read_time_s(self, num_commands: int, num_bytes: float) -> float:
        """Channel time of a batch of reads (see the module docstring)."""
        return num_bytes / self.read_bytes_per_s + (
            num_commands * self.command_latency_s / self.queue_depth)

    def write_time_s(self, num_commands: int, num_bytes: float) -> float:
        """Channel time of a batch of writes."""
        return num_bytes / self.write_bytes_per_s + (
            num_commands * self.command_latency_s / self.queue_depth)

    def aligned(self, num_bytes: int) -> int:
        """``num_bytes`` rounded up to whole alignment units."""
        a = self.align_bytes
        return (num_bytes + a - 1) // a * a


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One serving node: ``num_workers`` data-parallel GPUs, host memory and SSDs.

    Attributes:
        num_workers: GPUs, each running its own engine with its own KV pool (data
            parallel attention); a session sticks to one worker.
        gpu: per-worker GPU.
        host_to_gpu_bytes_per_s: host memory -> GPU copy bandwidth per worker.
        host_memory_bytes: host-memory KV budget of the whole node (every system gets
            the same).
        ssd: the node's SSDs.
        staging_bytes_per_worker: Mooncake's client staging buffer per worker
            (``local_buffer_size``); ``tiered`` allocates it per read batch
            (``AllocateBatch``), so it caps a batch's size, never a whole restore.
        routing: how requests pick a worker: ``round_robin`` (SGLang's data-parallel
            default, ``--load-balance-method round_robin``), ``session`` (a session
            sticks to the worker of its first request) or ``prefix`` (the worker whose
            prefix cache holds the longest prefix, then the least loaded).
        gpus_per_worker: GPUs of one worker's tensor-parallel engine. Each GPU holds
            its share of every block (its KV heads) and reads it from its own drive, so
            a read command moves one GPU's share; the worker's SSD channel is the
            aggregate of its GPUs' drives (``ssd`` figures are per worker).
        restore_overhead_s: fixed latency of one restore or prefetch on top of its
            device time (index lookup, submission, completion handling), the same for
            every system.
        store_command_s: cost of one read command of a FlatCake restore when it was
            measured through the store's own restore path (``flatcake bench
            --calibrate``); 0 charges the SSD model's ``command_latency_s /
            queue_depth`` like every other system. The baselines' paths are not
            measured, so they keep the drive's figures.
        uncached_kinds: layer kinds (``LayerGroup.kind``) the engine does not
            prefix-cache: it rebuilds their state itself on a hit, charged to no system.
            Like the vLLM connector (``connectors.vllm_glue.KVGroups`` stores only the
            prefix-cacheable groups), FlatCake neither stores nor restores them, and they
            never cut a hit back; the baselines neither store nor read them either. A
            windowed kind not listed the baselines store with every block and read at
            a hit's end, as vLLM's OffloadingConnector does (``layers.PeerBlocks``).
        ssd_loads_in_step: FlatCake's SSD hits load in the step that schedules the
            request, the forward waiting per layer (``layered_s``), as the vLLM
            connector does on a CPU engine (its ``ssd_loads_in_step``); ``False`` (a GPU
            engine) restores the hit before the request may be scheduled.
    """

    num_workers: int
    gpu: GpuSpec
    host_to_gpu_bytes_per_s: float
    host_memory_bytes: int
    ssd: SsdSpec
    staging_bytes_per_worker: int
    routing: str = "round_robin"
    gpus_per_worker: int = 1
    restore_overhead_s: float = 0.0
    store_command_s: float = 0.0
    uncached_kinds: tuple[str, ...] = ()
    ssd_loads_in_step: bool = False

    def __post_init__(self) -> None:
        _positive("node.num_workers", self.num_workers)
        if not isinstance(self.uncached_kinds, tuple) or \
                not all(isinstance(k, str) for k in self.uncached_kinds):
            raise ValueError(f"invalid replay device spec node.uncached_kinds="
                             f"{self.uncached_kinds!r}: a tuple of layer kind names")
        _positive("node.gpus_per_worker", self.gpus_per_worker)
        if self.routing not in ROUTINGS:
            raise ValueError(f"invalid replay device spec node.routing={self.routing!r}: "
                             f"choose one of {', '.join(ROUTINGS)}")
        _positive("node.host_to_gpu_bytes_per_s", self.host_to_gpu_bytes_per_s)
        _non_negative("node.host_memory_bytes", self.host_memory_bytes)
        _non_negative("node.staging_bytes_per_worker", self.staging_bytes_per_worker)
        _non_negative("node.restore_overhead_s", self.restore_overhead_s)
        _non_negative("node.store_command_s", self.store_command_s)


class FifoServer:
    """A resource serving jobs one at a time, first come first served.

    ``submit(now, work_s)`` returns the job's finish time. Also counts busy seconds,
    bytes and commands, for bandwidth metrics. Owned by the event loop's thread.
    """

    __slots__ = ("busy_s", "busy_until_s", "num_bytes", "num_commands", "num_jobs")

    def __init__(self) -> None:
        self.busy_until_s = 0.0
        self.busy_s = 0.0
        self.num_bytes = 0
        self.num_commands = 0
        self.num_jobs = 0

    def submit(self, now_s: float, work_s: float, num_bytes: int = 0,
               num_commands: int = 0) -> float:
        start = now_s if now_s > self.busy_until_s else self.busy_until_s
        self.busy_until_s = start + work_s
        self.busy_s += work_s
        self.num_bytes += num_bytes
        self.num_commands += num_commands
        self.num_jobs += 1
        return self.busy_until_s


@dataclass(frozen=True, slots=True)
class NetSpec:
    """The network between the nodes of a simulated cluster (``replay.cluster``).

    Attributes:
        bytes_per_s: one worker's NIC bandwidth (each GPU has its own RDMA NIC and
            receives remote blocks straight into its memory); remote reads of a worker
            queue on its NIC first come first served.
        latency_s: fixed cost of one remote transfer (request, completion) on top of
            its time on the NIC.
    """

    bytes_per_s: float = 200e9 / 8
    latency_s: float = 20e-6

    def __post_init__(self) -> None:
        _positive("net.bytes_per_s", self.bytes_per_s)
        _non_negative("net.latency_s", self.latency_s)
