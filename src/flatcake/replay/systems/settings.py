"""The tiered baselines' constants (``TieredConfig``), each with its source: Mooncake
Store's bucket backend and SGLang HiCache's L3 prefetch (``tiered``, ``prefetch``)."""

from __future__ import annotations

from dataclasses import dataclass

MB = 1000**2
WINDOW_RULES = ("vllm", "sglang")
"""How a baseline stores a sliding window the engine prefix-caches (``layers.PeerBlocks``)."""


@dataclass(frozen=True, slots=True)
class TieredConfig:
    """Constants of the tiered baselines (sources here and in ``prefetch.py``).

    Attributes:
        bucket_bytes: a bucket is sealed at this size (Mooncake default 256 MB).
        bucket_keys: ... or at this many objects (Mooncake default 500).
        prefetch_threshold_tokens: shorter SSD prefetches are not issued (HiCache 256).
        direct: read SSD hits straight into the GPU (tiered-direct), no host pool.
        direct_reads_per_layer: direct reads issue one command per block per layer.
        prefetch_policy: ``best_effort`` (SGLang's default), ``wait_complete`` or
            ``timeout`` (``--hicache-storage-prefetch-policy``).
        batch_pages: pages per L3 read batch (SGLang ``STORAGE_BATCH_SIZE`` = 128).
        prefetch_capacity_fraction: share of an engine's host pool that reserved
            prefetches may hold before new ones are refused (SGLang
            ``prefetch_capacity_limit`` = 0.5 x host pool).
        read_queue_depth: commands in flight while reading a batch: 1 for Mooncake's
            default sequential ``pread`` path; 0 means the drive's queue depth
            (``MOONCAKE_OFFLOAD_USE_URING`` on).
        batch_overhead_s: fixed cost of one ``BatchGet`` (metadata lookup at the
            master, staging allocation, completion): an assumption, 0.5 ms.
        timeout_base_s / timeout_per_ki_token_s / timeout_max_s: the ``timeout``
            policy's limit, ``min(max, base + per_ki_token * tokens / 1024)``.
        window_rule: how a sliding window the engine prefix-caches is stored
            (``layers.PeerBlocks``): ``sglang`` (SGLang 0.5.23 HiCache: one trailing
            window per request, hits cut back to a prefix whose window is held) or
            ``vllm`` (vLLM 0.32's offloading: every block); ``tiered-direct`` takes
            ``vllm``.
    """

    bucket_bytes: int = 256 * MB
    bucket_keys: int = 500
    prefetch_threshold_tokens: int = 256
    direct: bool = False
    direct_reads_per_layer: bool = True
    prefetch_policy: str = "best_effort"
    batch_pages: int = 128
    prefetch_capacity_fraction: float = 0.5
    read_queue_depth: int = 1
    batch_overhead_s: float = 0.0005
    timeout_base_s: float = 2.0
    timeout_per_ki_token_s: float = 0.1
    timeout_max_s: float = 30.0
    window_rule: str = "sglang"

    def __post_init__(self) -> None:
        for name in ("bucket_bytes", "bucket_keys", "batch_pages"):
            if getattr(self, name) <= 0:
                raise ValueError(f"invalid tiered.{name}={getattr(self, name)!r}: must be > 0")
        for name in ("prefetch_threshold_tokens", "read_queue_depth", "batch_overhead_s",
                     "timeout_base_s", "timeout_per_ki_token_s", "timeout_max_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"invalid tiered.{name}={getattr(self, name)!r}: "
                                 f"must be >= 0")
        if not 0 < self.prefetch_capacity_fraction <= 1:
            raise ValueError(f"invalid tiered.prefetch_capacity_fraction="
                             f"{self.prefetch_capacity_fraction!r}: must be in (0, 1]")
        if self.window_rule not in WINDOW_RULES:
            raise ValueError(f"invalid tiered.window_rule={self.window_rule!r}: choose "
                             f"{' or '.join(WINDOW_RULES)}")
        if self.prefetch_policy not in ("best_effort", "wait_complete", "timeout"):
            raise ValueError(f"invalid tiered.prefetch_policy={self.prefetch_policy!r}: "
                             f"choose best_effort, wait_complete or timeout")
