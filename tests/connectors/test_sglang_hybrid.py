"""SGLang's hybrid cache controller registers each host pool of a hybrid model with the
storage backend at start (``register_mem_host_pool_v2``: the KV pool, then a Mamba /
Gated DeltaNet state, sliding-window or indexer pool); FlatCake's backend takes the KV
pool and refuses any other by name, saying what it lacks (SGLang's v2 storage calls),
so the server does not start rather than fail at its first prefetch. Runs without
SGLang: where it is absent, a test double of its storage module stands in."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

import pytest
import torch

from flatcake.connectors.sglang_pool import extra_pool_refusal


class PoolName(StrEnum):  # SGLang's names of a hybrid model's host pools
    KV = "kv"
    MAMBA = "mamba"
    SWA = "swa"


class MambaPoolHost:
    """A test double of SGLang's Mamba state host pool: its attributes, no tensor."""

    layer_num = 36
    page_size = 1


class MHATokenToKVPoolHost:
    """A test double of SGLang's MHA host pool (the attributes the backend reads)."""

    layout, page_size, layer_num, head_num, head_dim = "layer_first", 4, 2, 2, 64
    dtype = torch.bfloat16

    def __init__(self) -> None:
        self.kv_buffer = torch.zeros(2, 2, 64, 2, 64, dtype=torch.bfloat16)


class _Storage:
    """``HiCacheStorage``'s registration hooks, as SGLang's base class has them."""

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        self.mem_pool_host = mem_pool_host

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        if not hasattr(self, "registered_pools"):
            self.registered_pools = {}
        self.registered_pools[host_pool_name] = host_pool


@pytest.fixture
def backend_class() -> Iterator[type]:
    """``FlatCakeHiCacheStorage``, over SGLang's storage module or its test double."""
    names = ("sglang", "sglang.srt", "sglang.srt.mem_cache",
             "sglang.srt.mem_cache.hicache_storage")
    faked = importlib.util.find_spec("sglang") is None
    if faked:
        for name in names:
            sys.modules[name] = types.ModuleType(name)
        storage = sys.modules[names[-1]]
        storage.HiCacheStorage = _Storage  # type: ignore[attr-defined]
        storage.HiCacheStorageConfig = object  # type: ignore[attr-defined]
        sys.modules.pop("flatcake.connectors.sglang", None)
    try:
        yield importlib.import_module("flatcake.connectors.sglang").FlatCakeHiCacheStorage
    finally:
        if faked:
            for name in (*names, "flatcake.connectors.sglang"):
                sys.modules.pop(name, None)
            connectors = sys.modules["flatcake.connectors"]
            if hasattr(connectors, "sglang"):
                delattr(connectors, "sglang")


def test_a_hybrid_models_state_pool_is_refused_at_registration(tmp_path: Any,
                                                               backend_class: type) -> None:
    config = types.SimpleNamespace(extra_config={"store": {"root": str(tmp_path)}},
                                   model_name="qwen3-next", tp_rank=0, tp_size=1, pp_rank=0,
                                   pp_size=1, is_mla_model=False)
    kv = MHATokenToKVPoolHost()
    backend = backend_class(config, {"mem_pool_host": kv})
    try:
        backend.register_mem_host_pool_v2(kv, PoolName.KV)  # the KV pool: taken
        assert backend.registered_pools == {PoolName.KV: kv}
        with pytest.raises(ValueError, match=r"hybrid host pool 'mamba' \(MambaPoolHost, "
                                             r"36 layers\).*batch_exists_v2"):
            backend.register_mem_host_pool_v2(MambaPoolHost(), PoolName.MAMBA)
        assert list(backend.registered_pools) == [PoolName.KV]
        assert backend.store is not None and backend.view is not None  # the KV pool's
    finally:
        backend.close()


def test_every_pool_but_the_kv_pool_is_refused_by_name() -> None:
    assert extra_pool_refusal(MHATokenToKVPoolHost(), PoolName.KV) == ""
    assert extra_pool_refusal(MHATokenToKVPoolHost(), "kv") == ""
    why = extra_pool_refusal(types.SimpleNamespace(), PoolName.SWA)
    assert why.startswith("FlatCake's SGLang backend cannot serve the hybrid host pool "
                          "'swa' (SimpleNamespace)")
    assert "batch_get_v2, batch_set_v2" in why and "vLLM connector" in why
