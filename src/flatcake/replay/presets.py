"""Named settings of the replay: model geometry, node devices, budgets, store knobs.

Every number is either sourced (a datasheet, a peer's default, a paper figure) or an
*assumption*, and each preset lists its assumptions in ``assumptions`` so that
``flatcake replay --explain`` and the docs can print them.

* ``paper``: the paper's setting as far as it is published. 8 workers; about 0.8 GiB of
  KV per worker for a 219K-token request; about 5x memory-over-SSD bandwidth; a 4 TiB
  SSD. Everything else is stated below as an assumption.
* ``llama70b``: Llama-3.1-70B (80 layers, 8 KV heads, 128 dims, bf16: 320 KiB per
  token) for the 16K vs 64K layout comparison of tiered-direct against FlatCake.
* ``local``: the paper node's shape with the SSD constants measured on this machine.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flatcake.config import FlatCakeConfig, PlannerConfig, SchedulerConfig, StoreConfig
from flatcake.geometry import KVGeometry
from flatcake.geometry import preset as geometry_preset
from flatcake.replay.calibration import CALIBRATION_ENV, Calibration, load_calibration
from flatcake.replay.node.devices import GB, GIB, GpuSpec, NetSpec, NodeSpec, SsdSpec
from flatcake.replay.systems.tiered import TieredConfig

TIB = 1024 * GIB
MIB = 1024**2


@dataclass(frozen=True, slots=True)
class ReplayPreset:
    """One named setting.

    Attributes:
        name: preset name.
        description: one line.
        geometry: per-worker KV geometry; its block size is replaced by the trace's.
        node: devices and budgets (same for every system).
        flatcake: FlatCake's configuration (placement thresholds, planner, scheduler);
            its store budgets are overwritten with the node's.
        tiered: the tiered baselines' constants.
        rates: the default sweep's request rates (req/s).
        assumptions: every number not taken from a published source.
        builtin_block_tokens: block size of the built-in generated workload.
        think_cap_s: longest think time replayed (``replay.node.arrivals``): longer gaps
            in a session trace (a user away) are cut to this.
        cost_source: where the fixed per-restore cost and the per-command cost come
            from (a guess, or a measurement on the disk at hand).
        net: the network between nodes when the replay runs a cluster
            (``--nodes N``): per-worker NIC bandwidth and per-transfer latency.
    """

    name: str
    description: str
    geometry: KVGeometry
    node: NodeSpec
    flatcake: FlatCakeConfig
    tiered: TieredConfig
    rates: tuple[float, ...]
    assumptions: tuple[str, ...]
    builtin_block_tokens: int = 64
    think_cap_s: float = 60.0
    cost_source: str = "documented guesses (see the assumptions)"
    net: NetSpec = dataclasses.field(default_factory=NetSpec)

    def flatcake_config(self) -> FlatCakeConfig:
        """FlatCake's config with the node's memory and SSD budgets."""
        store = dataclasses.replace(
            self.flatcake.store,
            memory_capacity_bytes=int(self.node.host_memory_bytes),
            ssd_capacity_bytes=int(self.node.ssd.capacity_bytes))
        return dataclasses.replace(self.flatcake, store=store)

    def geometry_lines(self, tokens_per_block: int | None = None) -> list[str]:
        """The geometry and the fixed costs a replay charges, as ``--explain`` prints
        them (``tokens_per_block``: a trace's block size, which replaces the preset's,
        or the smallest multiple of it holding whole entries of every layer kind)."""
        trace_block = tokens_per_block or self.builtin_block_tokens
        g = self.geometry.with_block_size(self.geometry.whole_entry_tokens(trace_block))
        align = self.node.ssd.align_bytes
        windows = g.layer_window_blocks or (0,) * g.num_layers
        kinds = []
        at = 0
        for grp in g.layer_groups:
            size = g.layer_block_bytes[at]
            win = windows[at]
            at += grp.num_layers
            kinds.append(f"{grp.kind} {grp.num_layers} x {size:,} B "
                         f"({size / align:.2f} x {align:,} B)"
                         + (f", window {win} block{'s' if win > 1 else ''}" if win else ""))
        recut = (f" (the trace's {trace_block}-token blocks re-cut into blocks of whole "
                 f"entries of every kind)" if g.tokens_per_block != trace_block else "")
        ssd = self.node.ssd
        return [
            f"geometry {g.name}: {g.num_layers} layers, {g.tokens_per_block}-token "
            f"blocks{recut}; per block and layer: {'; '.join(kinds)}; "
            f"{g.history_block_bytes:,} B per block in the layers that keep every block "
            f"({g.history_block_bytes // g.tokens_per_block:,} B per token); a range "
            f"not a multiple of {align:,} B is widened to whole units at both ends "
            f"(O_DIRECT) and the padding is read",
            f"fixed cost per restore {self.node.restore_overhead_s * 1e6:,.0f} us; SSD "
            f"{ssd.read_bytes_per_s / 1e9:.3g} GB/s read, {ssd.command_latency_s * 1e6:,.0f}"
            f" us per command with {ssd.queue_depth} in flight "
            f"({ssd.command_latency_s / ssd.queue_depth * 1e6:,.2f} us each)"
            + (f"; FlatCake's restore path {self.node.store_command_s * 1e6:,.0f} us per "
               f"command" if self.node.store_command_s else "")
            + f": {self.cost_source}",
        ]

    def with_node(self, **changes: Any) -> ReplayPreset:
        """A copy with some ``NodeSpec`` fields replaced; ``gpu_kv_capacity_bytes``
        replaces the KV pool of every worker's GPU (the GPU-pool sensitivity)."""
        pool = changes.pop("gpu_kv_capacity_bytes", None)
        if pool is not None:
            changes["gpu"] = dataclasses.replace(changes.get("gpu", self.node.gpu),
                                                 kv_capacity_bytes=int(pool))
        return dataclasses.replace(self, node=dataclasses.replace(self.node, **changes))


# ---------------------------------------------------------------------------- paper
# DeepSeek-V4-Flash (the paper's model) as vLLM caches it with --kv-cache-dtype fp8: the
# store's own geometry (``flatcake.geometry``, preset ``deepseek-v4-flash``), each of
# vLLM's per-layer caches as it is: a 128-token window of raw entries in all 43 layers,
# 21 c4a layers' entries and indexer keys (585 + 135 B per 4 tokens), 20 c128a layers'
# entries (864 B per 128 tokens), and the compressor state of tokens still being
# compressed (windows of 8 and 128 tokens). A c128a entry spans two of the Claude Code
# trace's 64-token blocks, so the
# replay re-cuts the trace into 128-token blocks (``simulate.replay_blocks``).
PAPER_GEOMETRY = geometry_preset("deepseek-v4-flash")

PAPER_SSD = SsdSpec(
    capacity_bytes=4 * TIB,  # paper: 4 TiB SSD
    read_bytes_per_s=6.0 * GB,  # assumption: one PCIe Gen4 NVMe drive per GPU (~6-7 GB/s)
    write_bytes_per_s=4.0 * GB,  # assumption: same drive's sequential write
    command_latency_s=80e-6,  # NVMe read latency at low queue depth (datasheets: 70-90 us)
    queue_depth=32,  # assumption: commands one worker's restore path keeps in flight
)

PAPER_GPU = GpuSpec(
    kv_capacity_bytes=6 * GIB,  # assumption (see PAPER_ASSUMPTIONS)
    prefill_tokens_per_s=20_000.0,  # assumption: B200-class worker, MoE with ~13B active
    attn_s_per_token_pair=2.0e-11,  # assumption: sparse attention, near-linear prefill
    prefill_overhead_s=0.02,  # assumption: launch + sampling + scheduling
    decode_step_base_s=0.015,  # assumption: weight read per step (expert-parallel)
    decode_step_per_seq_s=0.0002,  # assumption
    hbm_bytes_per_s=8.0e12,  # B200 HBM3e: 8 TB/s
    max_batch_seqs=256,
)

PAPER_NODE = NodeSpec(
    num_workers=8,  # paper: 8 GPUs
    gpu=PAPER_GPU,
    host_to_gpu_bytes_per_s=30.0 * GB,  # paper: ~5x the SSD's bandwidth (6 GB/s)
    host_memory_bytes=8 * GIB,  # assumption (see PAPER_ASSUMPTIONS)
    ssd=PAPER_SSD,
    staging_bytes_per_worker=1280 * MIB,  # Mooncake FileStorageConfig.local_buffer_size
    restore_overhead_s=0.001,  # assumption (see PAPER_ASSUMPTIONS)
    # The sliding window under vLLM's bounded replay: not prefix-cached, rebuilt on a hit
    # (vllm/v1/kv_cache_interface.py, vLLM 0.32: SlidingWindowMLASpec.prefix_cacheable is
    # `not bounded_replay`, prefix_replay_tokens the window). vLLM 0.32 turns it on for
    # DeepSeek-V4.1 (models/deepseek_v41/attention.py, --swa-bounded-replay, default on
    # with model runner V2); its DeepseekV4ForCausalLM (models/deepseek_v4) builds the
    # sliding cache without it, so the window is prefix-cached there: () replays that.
    uncached_kinds=("sliding",),
)

PAPER_FIXED_COST = (
    "Every restore or prefetch pays a fixed 1 ms on top of its device time (lookup, "
    "submission, completion handling): a guess for the paper's node (not published), the "
    "same for every system; a command costs 80 us / 32 in flight = 2.5 us. The local "
    "preset measures both on the disk at hand instead (flatcake bench --calibrate).")

PAPER_ASSUMPTIONS: tuple[str, ...] = (
    "KV geometry: DeepSeek-V4-Flash with vLLM's fp8 cache, every layer kind as it is "
    "(the store's deepseek-v4-flash geometry, each of vLLM 0.32's per-layer caches): "
    "21 c4a layers keep a 585 B entry and a 135 B indexer key per 4 tokens, 20 c128a "
    "layers an 864 B entry per 128 tokens (vLLM's pages, padded to 576 B); all 43 "
    "layers a 128-token sliding window of 585 B per token; the compressor state of "
    "tokens not yet compressed is a window too (c4a 8 tokens of 8,208 + 2,160 B, c128a "
    "128 tokens of 4,104 B). The layers that keep every block take 3,915 B per token, "
    "so a 219K-token request is 0.80 GiB "
    "per worker, the paper's 0.8 GiB. A c128a entry spans 128 tokens, two of the trace's "
    "64-token blocks: the replay re-cuts the trace into 128-token blocks (FlatCake's "
    "block for this model; vLLM aligns a hybrid model's prefix hit to its scheduler "
    "block), so a prompt's last odd 64-token block, a partial entry, is recomputed by "
    "every system. Sliding-window layers: no system stores, restores or is charged for "
    "them, FlatCake included: under vLLM's bounded replay of the window (DeepSeek-V4.1's "
    "default in vLLM 0.32; its DeepSeek-V4 model class does not use it) the sliding "
    "group is not prefix-cached and the engine rebuilds the window on a hit, which the "
    "replay charges no system; the vLLM connector stores only the prefix-cacheable "
    "groups, so it neither stores these layers nor cuts a hit back for them. The "
    "compressor state is prefix-cached with bounded replay on or off: a window kind "
    "each system stores by its engine's rule (FlatCake each turn's last window, the "
    "HiCache baselines SGLang's one trailing window per request with hits cut back to a "
    "held window, tiered-direct vLLM's every block; layers.PeerBlocks).",
    "8 data-parallel workers (DP attention: each GPU holds the KV of its own requests); "
    "requests are spread round robin (SGLang's --load-balance-method default), so a "
    "session's next turn usually lands on another GPU and its history must come from "
    "the shared host memory / SSD store.",
    "GPU KV pool 6 GiB per worker: about 7 of the paper's 0.8 GiB requests, just above "
    "the Claude Code trace's largest request (880K tokens = 3.4 GB); the paper does not "
    "publish it, and says a few concurrent sessions exceed memory.",
    "Host-memory KV budget 8 GiB for the node (1 GiB per worker): about ten of the "
    "paper's 0.8 GiB requests, 'a few concurrent sessions exceed memory'; it holds the "
    "live sessions of the Claude Code trace at 0.1 req/s (about 13 sessions, 6 GB) but "
    "not at 1 req/s (about 130); the paper gives every system the same budget but not "
    "its size. FlatCake's hit rate does not depend on it (its SSD holds every session); "
    "the baselines' does (see the replay report's host-memory sensitivity table).",
    "SSD: 6 GB/s read, 4 GB/s write per worker channel (one PCIe Gen4 NVMe drive per GPU), "
    "80 us command latency, 32 commands in flight (2.5 us per command, 400K IOPS).",
    "Host->GPU 30 GB/s per worker: the paper's 'about 5x memory-over-SSD bandwidth'.",
    "Prefill 20K tokens/s per worker plus 2e-11 s per (new, earlier) token pair; decode "
    "15 ms + 0.2 ms per sequence per step plus the KV read at 8 TB/s.",
    "Tiered (SGLang HiCache over Mooncake): each engine's HiCache host pool is its share "
    "of the host budget (1 GiB); L3 prefetches may reserve half of it (SGLang's "
    "prefetch_capacity_limit); one BatchGet of 128 pages costs 0.5 ms on top of its reads "
    "(metadata lookup, staging allocation, completion: a guess); Mooncake's 1280 MiB "
    "local_buffer_size stages one batch at a time.",
    PAPER_FIXED_COST,
    "Cluster replays (--nodes N): one 200 Gb/s RDMA NIC per worker (GPU), 20 us per remote "
    "transfer on top of its time on the NIC (a guess at an RDMA-class network; the "
    "owner's SSD read of a remote SSD block overlaps the transfer, layer by layer).",
    "Think times above 60 s (a user away; the Claude Code trace's 90th percentile gap is "
    "35 s) are replayed as 60 s, so sessions end and the requested rate can be offered.",
    "FlatCake: two restores in flight per worker (the two-layer window per stream, "
    "SchedulerConfig default), 64 KiB gap limit, 64 MiB largest read, 4 GiB session-file "
    "spans (they must hold the largest single turn, 880K tokens = 3.4 GB; the 64 GiB "
    "default leaves room for only 4,096 session files in the 48-bit SSD space, fewer "
    "than the Mooncake chat trace's conversations).",
)

PAPER = ReplayPreset(
    name="paper",
    description="the paper's node (8 workers, 0.8 GiB per 219K-token request, 4 TiB SSD)",
    geometry=PAPER_GEOMETRY,
    node=PAPER_NODE,
    flatcake=FlatCakeConfig(model=PAPER_GEOMETRY.name,
                            scheduler=SchedulerConfig(max_restores_in_flight=2),
                            planner=PlannerConfig(),
                            store=StoreConfig(session_file_bytes=4 * GIB)),
    tiered=TieredConfig(),
    # The paper's 0.1-1.0 req/s and on to 1.5, where the baselines' hit rates have
    # fallen and memory-only's recomputation nears the GPUs' limit (the knee).
    rates=(0.1, 0.25, 0.5, 1.0, 1.5),
    assumptions=PAPER_ASSUMPTIONS,
)

# --------------------------------------------------------------------------- qwen35
# Qwen3.5-35B-A3B (``flatcake.geometry`` preset ``qwen3.5-35b-a3b``, its sources there):
# 10 full-attention layers and 30 Gated DeltaNet layers whose state vLLM checkpoints
# every 544-token block (``mamba_cache_mode = "align"``). The node is the paper's with
# its KV budgets scaled by the bytes per token (20,480 B against DeepSeek-V4-Flash's
# 3,915 B, 5.2x), so each holds as many tokens as there.
QWEN35_GEOMETRY = geometry_preset("qwen3.5-35b-a3b")
QWEN35_NODE = dataclasses.replace(
    PAPER_NODE,
    gpu=dataclasses.replace(PAPER_GPU, kv_capacity_bytes=32 * GIB),
    host_memory_bytes=40 * GIB,
    ssd=dataclasses.replace(PAPER_SSD, capacity_bytes=16 * TIB),
    uncached_kinds=())

QWEN35 = ReplayPreset(
    name="qwen35",
    description="Qwen3.5-35B-A3B (10 attention + 30 Gated DeltaNet layers) on the "
                "paper's node",
    geometry=QWEN35_GEOMETRY,
    node=QWEN35_NODE,
    flatcake=dataclasses.replace(PAPER.flatcake, model=QWEN35_GEOMETRY.name,
                                 store=StoreConfig(session_file_bytes=32 * GIB)),
    tiered=TieredConfig(),
    rates=PAPER.rates,
    assumptions=(
        "KV geometry: Qwen3.5-35B-A3B in bf16 as vLLM 0.32 caches it with prefix "
        "caching (the store's qwen3.5-35b-a3b geometry): 10 full-attention layers of "
        "2,048 B per token, and 30 Gated DeltaNet layers each holding one recurrent "
        "state of 1,097,728 B (conv 3 x 8,192 + SSM 32 x 128 x 128, bf16) as of a "
        "position. vLLM's mamba_cache_mode 'align' checkpoints the state every 544 "
        "tokens (its attention block, sized so a page holds a state), so a hit can end "
        "only at a 544-token boundary whose state is held; the replay re-cuts the trace's "
        "64-token blocks into 1,088-token blocks (the smallest multiple of both), and "
        "a prompt's last partial block is recomputed by every system.",
        "State checkpoints, each system by its engine's rule (layers.PeerBlocks): "
        "FlatCake keeps the state at each turn's end and at branch points "
        "(store.window_rows), releasing older ones; tiered-direct a state at every "
        "block (vLLM's OffloadingConnector offloads the Mamba 'align' group by "
        "reachable_block_mask, dense by default), so its hits are never cut back for "
        "the state; the HiCache baselines one state at each request's end (SGLang's "
        "MambaRadixCache keeps the state where a request ends; HiCache's disk tier for "
        "it is still open upstream, so this is more than SGLang 0.5.23 stores).",
        "KV budgets: the paper preset's scaled by the bytes per token (20,480 B against "
        "3,915 B, 5.2x), so each holds about as many tokens as there: GPU KV pool 32 GiB "
        "per worker (the Claude Code trace's largest request, 880K tokens, is 18.4 GB), "
        "host memory 40 GiB for the node, SSD 16 TiB (every system's stores fit: "
        "tiered-direct's state at every block takes 2.5x the attention bytes), "
        "FlatCake's session-file spans 32 GiB (they must hold the largest turn).",
        PAPER_ASSUMPTIONS[1],
        *(a for a in PAPER_ASSUMPTIONS[4:]
          if not a.startswith(("Tiered (", "FlatCake: two"))),
        "Tiered (SGLang HiCache over Mooncake): each engine's HiCache host pool is its "
        "share of the host budget (5 GiB), the rest as in the paper preset.",
        "FlatCake: two restores in flight per worker, 64 KiB gap limit, 64 MiB largest "
        "read, as in the paper preset.",
    ),
)

# ------------------------------------------------------------------------- llama70b
# Llama-3.1-70B served by four tensor-parallel engines of 2 x H100 each (fp8 weights, 70
# GB, fit two GPUs). KV: 80 layers x 8 heads x 128 dims x (K, V) x 2 bytes = 320 KiB per
# token per engine, split over the engine's two GPUs; vLLM's 16-token blocks.
LLAMA70B_GPU = GpuSpec(
    kv_capacity_bytes=64 * GIB,  # assumption: 2 x 80 GB minus 70 GB of fp8 weights and
                                 # activation/graph memory
    prefill_tokens_per_s=11_000.0,  # assumption: 2*70e9 FLOP/token at 40% of 2 x 1979
                                    # TFLOP/s (H100 fp8 dense)
    attn_s_per_token_pair=1.7e-9,  # 4 x 8192 x 80 FLOP per (token, earlier token) pair
                                   # at the same rate
    prefill_overhead_s=0.03,  # assumption
    decode_step_base_s=0.012,  # 70 GB of weights read at 2 x 3.35 TB/s, plus overhead
    decode_step_per_seq_s=0.0003,  # assumption
    hbm_bytes_per_s=2 * 3.35e12,  # H100 SXM HBM3
    max_batch_seqs=256,
)

LLAMA70B = ReplayPreset(
    name="llama70b",
    description="Llama-3.1-70B on 4 engines of 2 x H100 (TP2), 16-token blocks",
    geometry=geometry_preset("llama-3.1-70b"),
    node=NodeSpec(
        num_workers=4,
        gpu=LLAMA70B_GPU,
        host_to_gpu_bytes_per_s=2 * 25.0 * GB,  # 2 GPUs x ~25 GB/s PCIe Gen5 x16
        host_memory_bytes=256 * GIB,  # assumption
        ssd=dataclasses.replace(PAPER_SSD, read_bytes_per_s=2 * 6.0 * GB,
                                write_bytes_per_s=2 * 4.0 * GB,
                                queue_depth=2 * 32),  # one drive per GPU
        staging_bytes_per_worker=2 * 1280 * MIB,  # Mooncake default, one client per GPU
        restore_overhead_s=0.001,  # assumption, as on the paper node
        gpus_per_worker=2,
    ),
    flatcake=FlatCakeConfig(model="llama-3.1-70b",
                            scheduler=SchedulerConfig(max_restores_in_flight=2)),
    tiered=TieredConfig(),
    rates=(0.05, 0.1, 0.2, 0.4),
    builtin_block_tokens=16,
    assumptions=(
        "Geometry: Llama-3.1-70B config.json (80 layers, 8 KV heads, head dim 128, bf16): "
        "320 KiB per token; the built-in workload uses vLLM's 16-token blocks.",
        "4 workers, each a tensor-parallel engine of 2 x H100 (fp8 weights): 64 GiB KV "
        "pool per engine; every GPU stores and reads its half of each block from its own "
        "NVMe drive (12 GB/s read, 8 GB/s write, 64 commands in flight per engine).",
        "Host budget 256 GiB for the node (every system), host->GPU 50 GB/s per engine.",
        "Prefill 11K tokens/s plus 1.7e-9 s per token pair (dense attention), per engine.",
        "Contexts capped with --context-tokens (16384 or 65536): built-in agent sessions "
        "compact to 30% when the next turn would pass the cap.",
        "Tiered staging: Mooncake's default 1280 MiB per GPU (2.5 GiB per engine), "
        "allocated per 128-page read batch.",
    ),
)

# ---------------------------------------------------------------------------- local
# Measured on the development machine (2 vCPUs, virtio disk, other jobs running: load
# average about 5) with ``python -m flatcake.bench.disk /work/main/.calib-tmp``:
# O_DIRECT 16 MiB reads 4 in flight 234.6 MB/s, 16 MiB writes 385.8 MB/s, 4 KiB random
# reads 238 us each one at a time, and 8 in flight hide about 3 of them.
LOCAL_SSD = SsdSpec(
    capacity_bytes=4 * TIB,
    read_bytes_per_s=234.6e6,
    write_bytes_per_s=385.8e6,
    command_latency_s=238e-6,
    queue_depth=3,
)

# ``flatcake bench --calibrate --dir /tmp/g9/caldir`` on the same machine (load average
# about 9; three runs, the median of each figure): a restore through the store costs
# 1.34 ms fixed and 220 us per read command (4 reader threads, Python and the crc checks
# on two busy cores), more than the raw drive's 79 us. $FLATCAKE_CALIBRATION replaces
# them.
LOCAL_COSTS = Calibration(
    restore_overhead_s=1.34e-3, command_s=220e-6,
    source="measured by flatcake bench --calibrate on the development machine (load "
           "average about 9); $FLATCAKE_CALIBRATION names a file measured here")

def with_costs(preset: ReplayPreset, cal: Calibration) -> ReplayPreset:
    """``preset`` charging ``cal``'s fixed cost per restore and cost per command."""
    node = dataclasses.replace(preset.node, restore_overhead_s=cal.restore_overhead_s,
                               store_command_s=cal.command_s)
    return dataclasses.replace(preset, node=node, cost_source=cal.source)


def with_calibration(preset: ReplayPreset, path: str | Path) -> ReplayPreset:
    """``preset`` with the measured fixed costs of the calibration file ``path``."""
    return with_costs(preset, load_calibration(path))


LOCAL = with_costs(dataclasses.replace(
    PAPER,
    name="local",
    description="the paper's node with this machine's measured SSD",
    node=dataclasses.replace(PAPER_NODE, ssd=LOCAL_SSD,
                             host_to_gpu_bytes_per_s=5 * LOCAL_SSD.read_bytes_per_s),
    rates=(0.02, 0.05, 0.1, 0.2),
    assumptions=(*(a for a in PAPER_ASSUMPTIONS if a is not PAPER_FIXED_COST),
                 "SSD measured on this machine: 234.6 MB/s read, 385.8 MB/s write, 238 us "
                 "per 4 KiB command, about 3 commands hidden per latency (O_DIRECT, "
                 "python -m flatcake.bench.disk); host->GPU kept at 5x the SSD.",
                 "Fixed cost per restore and cost per read command measured through the "
                 "store's restore path (flatcake bench --calibrate): 1.34 ms, paid by "
                 "every system, and 220 us per command of a FlatCake restore (the drive's "
                 "238 us / 3 = 79 us for the baselines, whose paths were not measured).",
                 "Rates scaled down with the SSD (the paper's 0.1-1.0 req/s would queue "
                 "restores without bound on a 0.23 GB/s drive)."),
), LOCAL_COSTS)

PRESETS: dict[str, ReplayPreset] = {p.name: p for p in (PAPER, QWEN35, LLAMA70B, LOCAL)}


def get_preset(name: str) -> ReplayPreset:
    """The named preset; ``local`` takes the fixed costs of the calibration file named by
    ``$FLATCAKE_CALIBRATION`` when it is set (``replay.calibration``)."""
    try:
        preset = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown replay preset {name!r}; choose one of "
                         f"{', '.join(PRESETS)}") from None
    path = os.environ.get(CALIBRATION_ENV)
    if name == LOCAL.name and path:
        preset = with_calibration(preset, path)
    return preset
