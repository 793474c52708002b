"""The SGLang backend's two data paths, MLA pools, and what ``batch_exists`` knows about
damage.

Direct: ``layer_first`` / ``page_first_direct`` pools with 4 KiB page halves (SGLang maps
the pool, so its base is aligned): the store reads into the pool's pages themselves, no
staging copy. Bounce: every other pool, through an aligned buffer, one copy. Runs in the
SGLang virtualenv; skipped where SGLang is not installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.connectors.sglang_helpers import (
    backend,
    chain,
    extra,
    host_pool,
    mla_pool,
    page_bytes,
    slots,
)

pytestmark = pytest.mark.sglang

PATHS = [("layer_first", 64, "direct"), ("page_first_direct", 64, "direct"),
         ("page_first", 64, "bounce"), ("layer_first", 32, "bounce")]


@pytest.mark.parametrize(("layout", "dim", "path"), PATHS)
def test_direct_and_bounce_paths_bit_exact(tmp_path: Path, layout: str, dim: int,
                                           path: str) -> None:
    pool = host_pool(layout, dim=dim)
    keys = chain(5)
    src = [3, 9, 4, 20, 21]
    want = [page_bytes(pool, p) for p in src]
    b = backend(pool, tmp_path)
    assert b.batch_set_v1(keys[:3], slots(src[:3]), extra([])) == [True] * 3
    assert b.batch_set_v1(keys[3:], slots(src[3:]), extra(keys[:3])) == [True] * 2
    b.close()
    b = backend(pool, tmp_path)  # after a restart: every page comes from the files
    dst = [30, 31, 2, 12, 13]
    before = page_bytes(pool, 0)
    assert b.batch_get_v1(keys, slots(dst), extra([])) == [True] * 5
    assert [page_bytes(pool, p) for p in dst] == want
    assert page_bytes(pool, 0) == before
    stats = b.get_stats()
    assert stats["read_path"] == path
    assert stats["loads_zero_copy"] == 1  # O_DIRECT into the pool, or into the bounce
    if path == "direct":
        assert stats["read_path_reason"] == ""
        assert (stats["pages_read_direct"], stats["pages_staged"]) == (5, 0)
    else:
        assert stats["read_path_reason"]
        assert (stats["pages_read_bounce"], stats["pages_staged"]) == (5, 5)
    b.close()


@pytest.mark.parametrize(("layout", "dim", "path"), [PATHS[0], PATHS[2]])
def test_damaged_segment_never_left_in_the_pool(tmp_path: Path, layout: str, dim: int,
                                                path: str) -> None:
    """A corrupted segment found by a read: False from that page on, and no byte of
    it (or past it) left in the pool: the bounce path never copies it, the direct path
    zeroes the pages its reads filled. From then on ``batch_exists`` stops before it."""
    pool = host_pool(layout, dim=dim)
    keys = chain(6)
    b = backend(pool, tmp_path)
    assert all(b.batch_set_v1(keys[:3], slots([1, 2, 3]), extra([])))
    assert all(b.batch_set_v1(keys[3:], slots([4, 5, 6]), extra(keys[:3])))
    b.close()
    victim = max((p for p in tmp_path.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[-4096 - 100] ^= 0xFF  # inside the second turn's data
    victim.write_bytes(bytes(data))
    b = backend(pool, tmp_path)
    assert b.batch_exists(keys, extra([])) == 6  # data crcs are not read by exists
    dst = [10, 11, 12, 13, 14, 15]
    before = [page_bytes(pool, p) for p in dst]
    assert b.batch_get_v1(keys, slots(dst), extra([])) == [True] * 3 + [False] * 3
    after = [page_bytes(pool, p) for p in dst[3:]]
    if path == "direct":
        assert after == [bytes(len(after[0]))] * 3
        assert b.get_stats()["pages_scrubbed"] == 3
    else:
        assert after == before[3:]
    assert b.batch_exists(keys, extra([])) == 3
    b.close()


def test_exists_stops_at_damage_the_restart_scan_found(tmp_path: Path) -> None:
    """A turn whose segment header is wrong is dropped by the restart scan (headers
    only): ``batch_exists`` never reports it, with no data read."""
    pool = host_pool("page_first")
    keys = chain(6)
    b = backend(pool, tmp_path)
    assert all(b.batch_set_v1(keys[:3], slots([1, 2, 3]), extra([])))
    sizes = {p: p.stat().st_size for p in tmp_path.rglob("*") if p.is_file()}
    assert all(b.batch_set_v1(keys[3:], slots([4, 5, 6]), extra(keys[:3])))
    b.close()
    grown = [p for p in tmp_path.rglob("*") if p.is_file() and p.stat().st_size > sizes.get(p, 0)]
    assert len(grown) == 1
    data = bytearray(grown[0].read_bytes())
    data[sizes.get(grown[0], 0) + 16] ^= 0xFF  # the second segment's header
    grown[0].write_bytes(bytes(data))
    b = backend(pool, tmp_path)
    assert b.batch_exists(keys, extra([])) == 3
    assert b.get_stats()["read_commands"] == 0
    assert b.batch_get_v1(keys, slots([20, 21, 22, 23, 24, 25]), extra([])) == \
        [True] * 3 + [False] * 3
    b.close()


@pytest.mark.parametrize(("layout", "rope", "path"), [("layer_first", 64, "direct"),
                                                      ("layer_first", 32, "bounce"),
                                                      ("page_first", 64, "bounce"),
                                                      ("page_first_direct", 64, "bounce")])
def test_mla_pool_round_trip(tmp_path: Path, layout: str, rope: int, path: str) -> None:
    """SGLang's ``MLATokenToKVPoolHost`` (one latent row per token, TP 1): bit-exact
    after a restart; an MHA pool of the same layout never reads its pages."""
    pool = mla_pool(layout, rope=rope)
    keys = chain(4)
    want = [page_bytes(pool, p) for p in (5, 6, 7, 8)]
    b = backend(pool, tmp_path)
    assert b.batch_set_v1(keys[:2], slots([5, 6]), extra([])) == [True] * 2
    assert b.batch_set_v1(keys[2:], slots([7, 8]), extra(keys[:2])) == [True] * 2
    b.close()
    b = backend(pool, tmp_path)
    dst = [20, 1, 33, 2]
    assert b.batch_get_v1(keys, slots(dst), extra([])) == [True] * 4
    assert [page_bytes(pool, p) for p in dst] == want
    stats = b.get_stats()
    assert stats["read_path"] == path
    # Bounce: one copy, two when the store's own staging window read it (3 KiB pages).
    assert stats["pages_staged"] == (0 if path == "direct" else 4 + 4 * stats["loads_staging"])
    assert stats["loads_staging"] == (rope == 32)
    b.close()
    mha = backend(host_pool(layout), tmp_path / "mha")
    assert mha.batch_exists(keys, extra([])) == 0
    mha.close()


def test_mla_with_tensor_parallel_ranks_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="MLA pools with tp_size 1 only"):
        backend(mla_pool("layer_first"), tmp_path, tp_size=2)
