"""A tiny node and geometry for hand-worked replay scenarios."""

from __future__ import annotations

import dataclasses

from flatcake.config import FlatCakeConfig, PlacementConfig, SchedulerConfig
from flatcake.geometry import KVGeometry
from flatcake.replay.node.devices import GpuSpec, NodeSpec, SsdSpec
from flatcake.replay.presets import ReplayPreset
from flatcake.replay.systems.tiered import TieredConfig

# 4 layers x 16 tokens x (K+V) x 1 head x 64 dims x 2 bytes: 4 KiB per block per layer.
GEOMETRY = KVGeometry(num_layers=4, tokens_per_block=16, num_kv_heads=1, head_dim=64,
                      name="tiny")
BLOCK_BYTES = GEOMETRY.block_bytes  # 16 KiB


def tiny_preset(*, workers: int = 1, gpu_blocks: int = 64, host_blocks: int = 1000,
                ssd_blocks: int = 100_000, staging_blocks: int = 1000,
                routing: str = "round_robin", slots: int = 2, ssd_read_bytes_per_s: float = 1e9,
                command_latency_s: float = 0.0, bucket_keys: int = 500,
                geometry: KVGeometry = GEOMETRY) -> ReplayPreset:
    """A one-worker test node; budgets are in blocks of ``geometry``."""
    bb = geometry.block_bytes
    gpu = GpuSpec(kv_capacity_bytes=gpu_blocks * bb, prefill_tokens_per_s=1e4,
                  attn_s_per_token_pair=0.0, prefill_overhead_s=0.001,
                  decode_step_base_s=0.001, decode_step_per_seq_s=0.0,
                  hbm_bytes_per_s=1e12)
    ssd = SsdSpec(capacity_bytes=ssd_blocks * bb,
                  read_bytes_per_s=ssd_read_bytes_per_s, write_bytes_per_s=1e9,
                  command_latency_s=command_latency_s, queue_depth=1)
    node = NodeSpec(num_workers=workers, gpu=gpu, host_to_gpu_bytes_per_s=1e10,
                    host_memory_bytes=host_blocks * bb, ssd=ssd,
                    staging_bytes_per_worker=staging_blocks * bb, routing=routing)
    # The short-reply rule on, no memory copies: the scenarios place turns by rule.
    fc = FlatCakeConfig(model="tiny", scheduler=SchedulerConfig(max_restores_in_flight=slots),
                        placement=PlacementConfig(short_reply_threshold_tokens=512,
                                                  memory_copy_watermark=0.0))
    return ReplayPreset(name="tiny", description="test node", geometry=geometry, node=node,
                        flatcake=fc,
                        tiered=dataclasses.replace(TieredConfig(), bucket_keys=bucket_keys,
                                                   prefetch_threshold_tokens=0),
                        rates=(1.0,), assumptions=())


def ids(start: int, stop: int) -> list[int]:
    return list(range(start, stop))
