"""SGLang with DP attention on one machine: each DP rank runs its own scheduler, host
pool and ``HiCacheController`` with FlatCake as its L3 backend, all attached to one node
service (``store.node``). A session's turn 0 backed up by rank A is prefetched whole by
rank B's controller for turn 1, byte for byte: from SSD with memory copies off, from the
service's shared arena with copies on. Turns backed up by either rank stay in the
session's one file, and a restore of the whole session reads at most layers x turns.
The two ranks are two controllers (each with its own backend, store and arena mapping)
in this process; with DP attention each DP rank's attention-TP rank is 0 of 1, as here.
Runs in the SGLang virtualenv."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.connectors.sglang_helpers import (
    LAYERS,
    PAGE,
    backup,
    controller,
    host_pool,
    one_rank_group,
    pages_of,
    prefetch,
)
from tests.service.helpers import Service

pytestmark = pytest.mark.sglang

# After the helpers: they skip this module where SGLang is absent and install the stand-ins.
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402


@pytest.fixture(scope="module")
def one_rank() -> Iterator[None]:
    with one_rank_group():
        yield


@pytest.mark.parametrize("copies", [False, True], ids=["ssd", "memory-copy"])
def test_turn_1_on_rank_b_gets_turn_0_from_the_node_service(one_rank: None, tmp_path: Path,
                                                            copies: bool) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "store.memory_capacity_bytes=8388608",
                  f"placement.memory_copy_watermark={0.9 if copies else 0}").start()
    store = {"node": f"unix:{svc.sock}", "node_timeout_s": 2}
    pool_a, pool_b = host_pool("layer_first", dim=64), host_pool("layer_first", dim=64)
    pool_b.kv_buffer.zero_()  # rank B holds nothing of rank A's
    turn0 = list(range(1000, 1000 + 3 * PAGE))
    turn1 = turn0 + list(range(3000, 3000 + 2 * PAGE + 5))
    hashes = get_storage_hash_str(turn0, None, page_size=PAGE)
    rank_a = rank_b = None
    try:
        rank_a = controller(pool_a, store)
        rank_b = controller(pool_b, store)
        src = pool_a.alloc(len(turn0))
        assert backup(rank_a, src, turn0, hashes, []) == len(turn0)
        loaded, dst = prefetch(rank_b, pool_b, "turn1", turn1)
        assert loaded == len(turn0)  # every full page of turn 0, from FlatCake
        assert pages_of(pool_b, dst) == pages_of(pool_a, src)
        stats = rank_b.storage_backend.get_stats()
        medium = "pages_got_memory" if copies else "pages_got_ssd"
        assert stats[medium] == 3 and stats["pages_got"] == 3, stats
        assert (stats["bytes_read"] > 0) == (not copies), stats
        # Rank B backs up turn 1, rank A turn 2: the session stays in its one file.
        turn2 = turn1[:5 * PAGE] + list(range(5000, 5000 + 2 * PAGE))
        chain = get_storage_hash_str(turn2, None, page_size=PAGE)
        more = pool_b.alloc(2 * PAGE)
        assert backup(rank_b, more, turn1[3 * PAGE:5 * PAGE], chain[3:5], chain[:3]) == \
            2 * PAGE
        last = pool_a.alloc(2 * PAGE)
        assert backup(rank_a, last, turn2[5 * PAGE:], chain[5:], chain[:5]) == 2 * PAGE
        assert len(list((svc.root / "sessions").iterdir())) == 1
        # A cold restore of the whole session on rank A: its own pages, B's and its own.
        loaded, dst = prefetch(rank_a, pool_a, "turn3", turn2 + [7] * 3)
        assert loaded == len(turn2)
        assert pages_of(pool_a, dst) == pages_of(pool_a, src) + pages_of(pool_b, more) + \
            pages_of(pool_a, last)
        reads = rank_a.storage_backend.get_stats()["read_commands"]
        assert reads <= LAYERS * 3, reads
    finally:
        for ctrl in (rank_a, rank_b):
            if ctrl is not None:
                ctrl.detach_storage_backend()
        assert svc.stop() == 0, svc.stderr()


def test_a_killed_service_is_a_miss_then_the_ranks_serve_again(one_rank: None,
                                                                tmp_path: Path) -> None:
    """The service SIGKILLed: both ranks' controllers keep going (a prefetch finds
    nothing, a backup stores nothing, no exception reaches SGLang); the service started
    again recovers the SSD turns and the ranks, attaching again by themselves, are
    served them and store again."""
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock").start()
    store = {"node": f"unix:{svc.sock}", "node_timeout_s": 1}
    pool_a, pool_b = host_pool("layer_first", dim=64), host_pool("layer_first", dim=64)
    pool_b.kv_buffer.zero_()
    turn0 = list(range(1000, 1000 + 3 * PAGE))
    other = list(range(7000, 7000 + 2 * PAGE))
    hashes = get_storage_hash_str(turn0, None, page_size=PAGE)
    rank_a = rank_b = None
    try:
        rank_a = controller(pool_a, store)
        rank_b = controller(pool_b, store)
        src = pool_a.alloc(len(turn0))
        assert backup(rank_a, src, turn0, hashes, []) == len(turn0)
        svc.kill()
        assert prefetch(rank_b, pool_b, "gone", [*turn0, 7])[0] == 0
        assert backup(rank_b, pool_b.alloc(len(other)), other,
                      get_storage_hash_str(other, None, page_size=PAGE), []) == 0
        svc.start()
        loaded, dst = prefetch(rank_b, pool_b, "back", [*turn0, 7])
        assert loaded == len(turn0) and pages_of(pool_b, dst) == pages_of(pool_a, src)
        assert backup(rank_b, pool_b.alloc(len(other)), other,
                      get_storage_hash_str(other, None, page_size=PAGE), []) == len(other)
    finally:
        for ctrl in (rank_a, rank_b):
            if ctrl is not None:
                ctrl.detach_storage_backend()
        assert svc.stop() == 0, svc.stderr()
