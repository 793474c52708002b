"""Builders for the SGLang backend tests: SGLang's own host pool, chained page keys,
the backend loaded the way SGLang loads it (``dynamic``), and SGLang's own
``HiCacheController`` driving it (``controller``, ``backup``, ``prefetch``)."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import importlib.util
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

if importlib.util.find_spec("sglang") is None:  # the test module importing this skips
    pytest.skip("SGLang is not installed (scripts/sglang_venv.sh builds its venv)",
                allow_module_level=True)

from tests.connectors.sglang_stubs import install_torchvision_stub

install_torchvision_stub()

from sglang.srt.managers.cache_controller import HiCacheController  # noqa: E402
from sglang.srt.mem_cache.device_pool_info import (  # noqa: E402
    KVBufferLayout,
    KVBuffers,
    MHABufferInfo,
    MLABufferInfo,
)
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402

LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
LAYERS, HEADS, DIM, PAGE = 3, 2, 32, 16
DEVICE_TOKENS = 512
WAIT_S = 60


def host_pool(layout: str, dtype: torch.dtype = torch.bfloat16, dim: int = DIM) -> Any:
    """SGLang's ``MHATokenToKVPoolHost`` (unpinned, CPU) filled with random bytes.
    ``dim=64`` makes a page's K (or V) of one layer 4 KiB (aligned: the direct path)."""
    k = tuple(torch.zeros(DEVICE_TOKENS, HEADS, dim, dtype=dtype) for _ in range(LAYERS))
    v = tuple(torch.zeros(DEVICE_TOKENS, HEADS, dim, dtype=dtype) for _ in range(LAYERS))

    def ptrs(ts: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)

    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v),
                          layout=KVBufferLayout.NHD),
        page_size=PAGE, head_num=HEADS, head_dim=dim, v_head_dim=dim, dtype=dtype,
        device=torch.device("cpu"))
    pool = MHATokenToKVPoolHost(info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=DEVICE_TOKENS, start_layer=0,
                                end_layer=LAYERS)
    _fill(pool)
    return pool


def mla_pool(layout: str, rope: int = 64, dtype: torch.dtype = torch.bfloat16) -> Any:
    """SGLang's ``MLATokenToKVPoolHost`` (unpinned, CPU; latent = 64 + ``rope``) filled
    with random bytes. ``rope=64`` makes a page's latent of one layer 4 KiB."""
    dim = 64 + rope
    rows = tuple(torch.zeros(DEVICE_TOKENS, 1, dim, dtype=dtype) for _ in range(LAYERS))
    info = MLABufferInfo(
        buffers=rows, data_ptrs=torch.tensor([t.data_ptr() for t in rows], dtype=torch.uint64),
        layer_indices=tuple(range(LAYERS)), device_layer_num=LAYERS, page_size=PAGE,
        kv_lora_rank=64, qk_rope_head_dim=rope, kv_cache_dim=dim, dtype=dtype,
        device=torch.device("cpu"))
    pool = MLATokenToKVPoolHost(info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=DEVICE_TOKENS, start_layer=0,
                                end_layer=LAYERS, target_layer_num=LAYERS)
    _fill(pool)
    return pool


def _fill(pool: Any) -> None:
    raw = pool.kv_buffer.view(-1).view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8,
                            generator=torch.Generator().manual_seed(7)))


def chain(n: int, seed: str = "s") -> list[str]:
    """``n`` chained SHA-256 page keys (hex), as SGLang hashes pages."""
    keys, prev = [], seed.encode()
    for i in range(n):
        prev = hashlib.sha256(prev + str(i).encode()).digest()
        keys.append(prev.hex())
    return keys


def slots(pages: list[int]) -> torch.Tensor:
    """Host token slots of ``pages`` (page-aligned, ``page_size`` each)."""
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])


def page_bytes(pool: Any, page: int) -> bytes:
    """Every byte of one page of the pool, layer by layer, K then V (or the latent)."""
    from flatcake.connectors.sglang_pool import HostPoolView

    view = HostPoolView(pool)
    out = []
    for layer in range(view.num_layers):
        for part in view.layer_kv(layer):  # K then V, or the MLA latent
            out.append(part[page].contiguous().view(torch.uint8).numpy().tobytes())
    return b"".join(out)


def extra(prefix: list[str]) -> HiCacheStorageExtraInfo:
    return HiCacheStorageExtraInfo(prefix_keys=list(prefix))


def backend(pool: Any, root: Path, *, tenant: str = "", model: str = "tiny-llama",
            tp_size: int = 1, **config: Any) -> Any:
    """The backend as SGLang builds it (``dynamic``), with the host pool registered."""
    extra_config = {"backend_name": "flatcake", "module_path": "flatcake.connectors.sglang",
                    "class_name": "FlatCakeHiCacheStorage", "interface_v1": 1,
                    "store": {"root": str(root), "io_mode": "auto",
                              "memory_capacity_bytes": 0},
                    "tenant_salt": tenant, **config}
    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=tp_size, pp_rank=0, pp_size=1,
                               attn_cp_rank=0, attn_cp_size=1,
                               is_mla_model=hasattr(pool, "kv_lora_rank"),
                               enable_storage_metrics=False,
                               is_page_first_layout=pool.layout != "layer_first",
                               model_name=model, extra_config=extra_config)
    b = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    b = getattr(b, "_backend", b)  # unwrap SGLang's failure injector when it wraps
    b.register_mem_pool_host(pool)
    return b


class _DevicePool:
    """What the controller reads of the device pool (L3 threads never touch it)."""

    device = torch.device("cpu")
    layer_num = LAYERS

    def register_layer_transfer_counter(self, counter: Any) -> None:
        self.counter = counter


class _Allocator:
    def get_kvcache(self) -> _DevicePool:
        return _DevicePool()


@contextlib.contextmanager
def one_rank_group() -> Iterator[None]:
    """A one-rank gloo process group and SGLang's parallel state for TP = PP = 1 (what
    ``HiCacheController`` needs; with DP attention each DP rank's attention-TP rank is
    0 of 1 as well)."""
    owned = not dist.is_initialized()
    if owned:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1, timeout=datetime.timedelta(seconds=WAIT_S))
    try:
        with get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                                     attn_dcp_size=1, attn_dcp_rank=0):
            yield
    finally:
        if owned:
            dist.destroy_process_group()


def controller(pool: Any, store: dict[str, Any]) -> HiCacheController:
    """SGLang's controller over ``pool`` with FlatCake as its L3 backend (``store``: the
    extra config's store section)."""
    extra = {"backend_name": "flatcake", "module_path": "flatcake.connectors.sglang",
             "class_name": "FlatCakeHiCacheStorage", "interface_v1": 1, "store": store}
    return HiCacheController(_Allocator(), pool, PAGE, dist.group.WORLD, threading.Event(),
                             write_policy="write_through", storage_backend="dynamic",
                             prefetch_threshold=PAGE, model_name="tiny-llama",
                             storage_backend_extra_config=extra)


def backup(ctrl: HiCacheController, slots: torch.Tensor, tokens: list[int],
           hashes: list[str], prefix: list[str]) -> int:
    """One write-through backup on the controller's backup thread; tokens it stored."""
    ctrl.write_storage(slots, tokens, hash_value=hashes, prefix_keys=prefix)
    return int(ctrl.ack_backup_queue.get(timeout=WAIT_S).completed_tokens)


def prefetch(ctrl: HiCacheController, pool: Any, rid: str, tokens: list[int]
             ) -> tuple[int, torch.Tensor]:
    """One prefetch as the scheduler drives it: the prefetch thread's hit query, host
    slots for the hit, then the I/O thread's load. Returns (tokens loaded, slots)."""
    op = ctrl.prefetch(rid, tokens, last_hash=None, prefix_keys=[])
    hit = ctrl.prefetch_hit_queue.get(timeout=WAIT_S)
    assert hit is op
    op.host_indices = pool.alloc(op.storage_hit_count)
    ctrl.prefetch_buffer.put(op)
    loaded = 0
    while True:
        ack = ctrl.ack_prefetch_queue.get(timeout=WAIT_S)
        if ack.completed_tokens is not None:
            loaded = max(loaded, int(ack.completed_tokens))
        if ack.completed_req:
            return loaded, op.host_indices


def pages_of(pool: Any, slots: torch.Tensor) -> list[bytes]:
    return [page_bytes(pool, int(s) // PAGE) for s in slots[::PAGE]]
