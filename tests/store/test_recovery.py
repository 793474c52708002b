"""Restart recovery, interrupted writes and corruption: a torn or corrupt segment is
never returned as KV; it is a miss, and everything before it is still served."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from flatcake.cio.files import QUARANTINE_DIR, SESSIONS_DIR
from flatcake.cio.filescan import scan_session_file
from flatcake.store import FlatCakeStore, fsck_root
from tests.store.helpers import (
    SMALL,
    TO_MEMORY,
    TO_SSD,
    block_bytes,
    empty_kv,
    random_kv,
    session_keys,
    small_config,
)

TURNS = [4, 3, 5]  # blocks per turn; request blocks [0,4) [4,7) [7,12)


def _write_history(root: Path, sessions: int = 1) -> tuple[list[torch.Tensor], list[list[bytes]]]:
    src = random_kv(SMALL, 12, seed=11)
    all_keys = [session_keys(100 + s, 12) for s in range(sessions)]
    with FlatCakeStore.open(root, SMALL, small_config()) as store:
        for s, keys in enumerate(all_keys):
            done = 0
            for n in TURNS:
                done += n
                store.store_turn(f"session {s}/../x", keys[:done], src, range(done), TO_SSD)
    return src, all_keys


def _only_file(root: Path) -> Path:
    (path,) = sorted((root / SESSIONS_DIR).iterdir())
    return path


def _assert_prefix(store: FlatCakeStore, keys: list[bytes], src: list[torch.Tensor],
                   expected: int) -> None:
    dst = empty_kv(SMALL, 12)
    res = store.load(keys, dst, range(12))
    assert res.num_blocks == expected
    for layer in range(SMALL.num_layers):
        for i in range(expected):
            assert block_bytes(dst, layer, i, "kv_blocks") == block_bytes(src, layer, i,
                                                                           "kv_blocks")


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0x40]))


def test_restart_rebuilds_the_index_from_session_files(tmp_path: Path) -> None:
    src, all_keys = _write_history(tmp_path, sessions=2)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        rec = store.recovery
        assert (rec.num_files, rec.num_sessions, rec.num_segments, rec.num_blocks) == (2, 2, 6,
                                                                                       24)
        assert rec.damaged_segments == 0
        assert sorted(s["session_id"] for s in store.inspect()["sessions"]) == [
            "session 0/../x", "session 1/../x"]
        for keys in all_keys:
            assert store.lookup(keys).num_ssd_blocks == 12
            _assert_prefix(store, keys, src, 12)
        # The session continues after the restart, in the same file.
        more = all_keys[0] + session_keys(999, 2)
        src2 = random_kv(SMALL, 14, seed=11)
        src2 = [torch.cat([s, t[:, 12:]], dim=1) for s, t in zip(src, src2, strict=True)]
        assert store.store_turn("session 0/../x", more, src2, range(14), TO_SSD).num_blocks == 2
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert store.recovery.num_segments == 7 and store.recovery.num_files == 2
        dst = empty_kv(SMALL, 14)
        assert store.load(more, dst, range(14)).num_blocks == 14


def test_memory_blocks_do_not_survive_a_restart(tmp_path: Path) -> None:
    src = random_kv(SMALL, 12)
    keys = session_keys(5, 8)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        store.store_turn("s", keys[:5], src, range(5), TO_SSD)
        store.store_turn("s", keys, src, range(8), TO_MEMORY)
        assert store.lookup(keys).num_blocks == 8
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert store.lookup(keys).num_blocks == 5


def test_interrupted_write_is_never_served(tmp_path: Path) -> None:
    src, (keys,) = _write_history(tmp_path)
    path = _only_file(tmp_path)
    _, segs, _ = scan_session_file(path)
    # The last write stopped half way through its data.
    os.truncate(path, segs[2].file_offset + segs[2].header.layout.total_bytes // 2)
    assert not fsck_root(tmp_path).ok
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert store.recovery.damaged_segments == 1 and store.recovery.num_segments == 2
        assert store.lookup(keys).num_blocks == 7
        _assert_prefix(store, keys, src, 7)
        # The file was cut at the torn segment; the next turn appends cleanly there.
        assert store.store_turn("session 0/../x", keys, src, range(12), TO_SSD).num_blocks == 5
    assert fsck_root(tmp_path).ok
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert store.recovery.num_segments == 3
        _assert_prefix(store, keys, src, 12)


def test_torn_data_over_preallocated_space_is_a_miss(tmp_path: Path) -> None:
    # The header reached the disk, the data did not (the file was preallocated, so its
    # size does not tell). A header-only scan adopts it; the load's crc check refuses it.
    _, (keys,) = _write_history(tmp_path)
    path = _only_file(tmp_path)
    _, segs, _ = scan_session_file(path)
    lay = segs[1].header.layout
    with open(path, "r+b") as fh:
        fh.seek(segs[1].file_offset + lay.data_offset)
        fh.write(bytes(lay.data_bytes))
    with FlatCakeStore.open(tmp_path, SMALL, small_config(), verify_on_open=True) as store:
        assert store.recovery.damaged_segments == 1
        assert store.lookup(keys).num_blocks == 4
    # (verify_on_open cut the file; write the damage again for the lazy path)
    _, (keys,) = _write_history(tmp_path / "lazy")
    path = _only_file(tmp_path / "lazy")
    with open(path, "r+b") as fh:
        fh.seek(segs[1].file_offset + lay.data_offset)
        fh.write(bytes(lay.data_bytes))
    with FlatCakeStore.open(tmp_path / "lazy", SMALL, small_config()) as store:
        assert store.lookup(keys).num_blocks == 12  # headers look fine
        dst = empty_kv(SMALL, 12)
        res = store.load(keys, dst, range(12))
        assert res.num_blocks == 4 and res.damaged_segments == 1
        assert not any(dst[layer][:, 4:7].any() for layer in range(SMALL.num_layers))


def test_header_damage_is_found_on_restart(tmp_path: Path) -> None:
    src, (keys,) = _write_history(tmp_path)
    path = _only_file(tmp_path)
    _, segs, _ = scan_session_file(path)
    _flip(path, segs[1].file_offset + 40)  # segment 1's header
    report = fsck_root(tmp_path)
    assert not report.ok and report.files[0].damaged[0].file_offset == segs[1].file_offset
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert store.recovery.damaged_segments == 1
        assert store.lookup(keys).num_blocks == 4
        _assert_prefix(store, keys, src, 4)


def test_damaged_file_header_quarantines_the_file(tmp_path: Path) -> None:
    _, (keys,) = _write_history(tmp_path)
    path = _only_file(tmp_path)
    _flip(path, 10)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert store.recovery.damaged_files == 1
        assert store.lookup(keys).num_blocks == 0
    assert (tmp_path / QUARANTINE_DIR / path.name).exists()
    # Settled damage: fsck lists the quarantined file but no longer fails.
    report = fsck_root(tmp_path)
    assert report.ok and not report.clean
    assert [(Path(f.path).name, f.state) for f in report.files] == [(path.name, "settled")]


def test_failed_write_is_rolled_back_and_never_served(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # The segment's bytes reach the file but fdatasync fails: the write is not durable,
    # so it is not published, its header is scrubbed, and its space is reused.
    src = random_kv(SMALL, 12)
    keys = session_keys(8, 12)
    real_sync = os.fdatasync
    failures = iter([True])

    def flaky_sync(fd: int) -> None:
        if next(failures, False):
            raise OSError(5, "Input/output error")
        real_sync(fd)

    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        store.store_turn("s", keys[:4], src, range(4), TO_SSD)
        monkeypatch.setattr("flatcake.cio.writer.os.fdatasync", flaky_sync)
        res = store.store_turn("s", keys[:8], src, range(8), TO_SSD)
        assert res.num_blocks == 0 and "Input/output" in res.error
        assert store.lookup(keys).num_blocks == 4
        store.control.check_integrity()
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert (store.recovery.num_segments, store.recovery.damaged_segments) == (1, 0)
        assert store.store_turn("s", keys, src, range(12), TO_SSD).num_blocks == 8
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        _assert_prefix(store, keys, src, 12)
