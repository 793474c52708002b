"""FlatCake driven by SGLang's own ``HiCacheController``: its backup thread writes pages
(``batch_set_v1``), its prefetch threads find (``batch_exists``) and load
(``batch_get_v1``) them, with SGLang's own chained page hashes.

The controller needs a process group and SGLang's parallel state: a one-rank gloo group
on 127.0.0.1 (with a timeout) and ``get_parallel().override`` for TP/PP size 1. The
device pool is a stand-in (the L3 threads touch only the host pool). Runs in the SGLang
virtualenv; skipped where SGLang is not installed.
"""

from __future__ import annotations

import datetime
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.connectors.sglang_helpers import LAYERS, PAGE, host_pool, page_bytes

pytestmark = pytest.mark.sglang

# After the helpers: they skip this module where SGLang is absent and install the stand-ins.
from sglang.srt.managers.cache_controller import HiCacheController  # noqa: E402
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402

WAIT_S = 60


class _DevicePool:
    """What the controller reads of the device pool (L3 threads never touch it)."""

    device = torch.device("cpu")
    layer_num = LAYERS

    def register_layer_transfer_counter(self, counter: Any) -> None:
        self.counter = counter


class _Allocator:
    def get_kvcache(self) -> _DevicePool:
        return _DevicePool()


@pytest.fixture(scope="module")
def one_rank() -> Iterator[None]:
    """A one-rank gloo process group and SGLang's parallel state for TP = PP = 1."""
    owned = not dist.is_initialized()
    if owned:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1, timeout=datetime.timedelta(seconds=WAIT_S))
    with get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                                 attn_dcp_size=1, attn_dcp_rank=0):
        yield
    if owned:
        dist.destroy_process_group()


def controller(pool: Any, root: Path) -> HiCacheController:
    extra = {"backend_name": "flatcake", "module_path": "flatcake.connectors.sglang",
             "class_name": "FlatCakeHiCacheStorage", "interface_v1": 1,
             "store": {"root": str(root), "memory_capacity_bytes": 0}}
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


@pytest.mark.parametrize(("layout", "dim", "path"), [("layer_first", 64, "direct"),
                                                     ("page_head", 32, "bounce")])
def test_round_trip_through_the_controllers_threads(one_rank: None, tmp_path: Path,
                                                    layout: str, dim: int,
                                                    path: str) -> None:
    pool = host_pool(layout, dim=dim)
    tokens = list(range(1000, 1000 + 6 * PAGE))
    hashes = get_storage_hash_str(tokens, None, page_size=PAGE)
    src = pool.alloc(len(tokens))
    want = pages_of(pool, src)
    ctrl = controller(pool, tmp_path)
    try:
        # Two turns of one session: the second extends the first's hash chain.
        assert backup(ctrl, src[:3 * PAGE], tokens[:3 * PAGE], hashes[:3], []) == 3 * PAGE
        assert backup(ctrl, src[3 * PAGE:], tokens[3 * PAGE:], hashes[3:], hashes[:3]) == \
            3 * PAGE
        # Another session backed up while the first is prefetched.
        other = list(range(5000, 5000 + 4 * PAGE))
        other_src = pool.alloc(len(other))
        other_want = pages_of(pool, other_src)
        ctrl.write_storage(other_src, other,
                           hash_value=get_storage_hash_str(other, None, page_size=PAGE),
                           prefix_keys=[])
        loaded, dst = prefetch(ctrl, pool, "r1", tokens)
        assert int(ctrl.ack_backup_queue.get(timeout=WAIT_S).completed_tokens) == 4 * PAGE
        assert loaded == len(tokens)
        assert pages_of(pool, dst) == want
        assert prefetch(ctrl, pool, "r2", tokens[:2 * PAGE] + [7] * PAGE)[0] == 2 * PAGE
        stats = ctrl.storage_backend.get_stats()
        assert stats["read_path"] == path
        assert stats["pages_set"] == 10
    finally:
        ctrl.detach_storage_backend()
    # A new controller over the same files (a restart) serves both sessions.
    ctrl = controller(pool, tmp_path)
    try:
        loaded, dst = prefetch(ctrl, pool, "r3", other)
        assert loaded == len(other) and pages_of(pool, dst) == other_want
        loaded, dst = prefetch(ctrl, pool, "r4", tokens)
        assert loaded == len(tokens) and pages_of(pool, dst) == want
    finally:
        ctrl.detach_storage_backend()
