"""FlatCake driven by SGLang's own ``HiCacheController``: its backup thread writes pages
(``batch_set_v1``), its prefetch threads find (``batch_exists``) and load
(``batch_get_v1``) them, with SGLang's own chained page hashes.

The controller needs a process group and SGLang's parallel state: a one-rank gloo group
on 127.0.0.1 (with a timeout) and ``get_parallel().override`` for TP/PP size 1. The
device pool is a stand-in (the L3 threads touch only the host pool). Runs in the SGLang
virtualenv; skipped where SGLang is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.connectors.sglang_helpers import (
    PAGE,
    WAIT_S,
    backup,
    controller,
    host_pool,
    one_rank_group,
    pages_of,
    prefetch,
)

pytestmark = pytest.mark.sglang

# After the helpers: they skip this module where SGLang is absent and install the stand-ins.
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402

STORE = {"memory_capacity_bytes": 0}


@pytest.fixture(scope="module")
def one_rank() -> Iterator[None]:
    with one_rank_group():
        yield


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
    ctrl = controller(pool, {**STORE, "root": str(tmp_path)})
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
    ctrl = controller(pool, {**STORE, "root": str(tmp_path)})
    try:
        loaded, dst = prefetch(ctrl, pool, "r3", other)
        assert loaded == len(other) and pages_of(pool, dst) == other_want
        loaded, dst = prefetch(ctrl, pool, "r4", tokens)
        assert loaded == len(tokens) and pages_of(pool, dst) == want
    finally:
        ctrl.detach_storage_backend()
