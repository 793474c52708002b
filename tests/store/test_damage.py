"""Damage found while serving: a segment that fails its checksum is a miss, never KV;
its session is cut there (the damaged segment and every later one unpublished, their
space given back, the file truncated on disk), the earlier turns stay served across a
restart, and the next turn appends right after the last good segment. Only a damaged
file header sends files to quarantine."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from flatcake.cio.files import QUARANTINE_DIR, SESSIONS_DIR
from flatcake.cio.filescan import ScannedSegment, scan_session_file
from flatcake.cio.staging import StagingWindow
from flatcake.config import FlatCakeConfig
from flatcake.store import FlatCakeStore, fsck_root
from tests.store.helpers import (
    SMALL,
    TO_SSD,
    block_bytes,
    empty_kv,
    random_kv,
    session_keys,
    small_config,
)

TURNS = [4, 3, 5, 2, 3]  # request blocks [0,4) [4,7) [7,12) [12,14) [14,17)
N = sum(TURNS)
GOOD = 7  # blocks of turns 1-2, before the damaged turn 3
SID = "agent/../session 1"


def _write(root: Path, cfg: FlatCakeConfig) -> tuple[list[torch.Tensor], list[bytes]]:
    src = random_kv(SMALL, N, seed=5)
    keys = session_keys(300, N)
    with FlatCakeStore.open(root, SMALL, cfg) as store:
        done = 0
        for n in TURNS:
            done += n
            store.store_turn(SID, keys[:done], src, range(done), TO_SSD)
    return src, keys


def _files(root: Path) -> list[Path]:
    return sorted((root / SESSIONS_DIR).iterdir())


def _segments(path: Path) -> list[ScannedSegment]:
    _, segs, bad = scan_session_file(path)
    assert bad == []
    return segs


def _flip_data(path: Path, seg: ScannedSegment) -> None:
    """Flip one bit in layer 1, block 1 of ``seg`` (its header stays valid)."""
    at = seg.file_offset + seg.header.layout.block_offset(1, 1)
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0x10]))


def _load(store: FlatCakeStore, keys: list[bytes], src: list[torch.Tensor], expected: int,
          damaged: int = 0) -> None:
    """Load the request: blocks [0, expected) byte-exact; after them nothing at all, in
    every layer from the damaged one (layer 1) on. (A damaged segment's earlier layers
    may have been scattered before the damage showed; ``num_blocks`` says they are a
    miss.)"""
    dst = empty_kv(SMALL, N)
    res = store.load(keys, dst, range(N))
    assert (res.num_blocks, res.damaged_segments) == (expected, damaged)
    for layer in range(SMALL.num_layers):
        for i in range(N):
            got = block_bytes(dst, layer, i, "kv_blocks")
            if i < expected:
                assert got == block_bytes(src, layer, i, "kv_blocks"), (layer, i)
            elif layer >= 1 or not damaged:
                assert got == bytes(len(got)), (layer, i)


@pytest.mark.parametrize("restart_before_rewrite", [False, True])
def test_damaged_turn_cuts_the_session_there(tmp_path: Path,
                                             restart_before_rewrite: bool) -> None:
    cfg = small_config()
    src, keys = _write(tmp_path, cfg)
    (path,) = _files(tmp_path)
    segs = _segments(path)
    assert len(segs) == 5
    with FlatCakeStore.open(tmp_path, SMALL, cfg) as store:
        _load(store, keys, src, N)
        _flip_data(path, segs[2])  # turn 3 rots on disk while the store serves
        _load(store, keys, src, GOOD, damaged=1)
        # Turns 1-2 still hit; turns 3-5 are a miss from now on (4-5 are intact but
        # come after the damage) and are never read again.
        assert store.lookup(keys).num_blocks == GOOD
        assert store.lookup(keys[:14]).num_ssd_blocks == GOOD
        _load(store, keys, src, GOOD, damaged=0)
        # The file is cut right after turn 2: nothing quarantined, fsck is clean.
        assert path.stat().st_size == segs[1].end_offset
        assert not (tmp_path / QUARANTINE_DIR).exists()
        assert store.fsck().ok
        # The SSD budget holds exactly the file header and turns 1-2.
        info = store.inspect()
        assert info["media"]["ssd"]["used_bytes"] == segs[1].end_offset
        assert info["media"]["ssd"]["segments"] == 2
        assert [s["damaged"] for s in info["sessions"]] == [False]
        assert store.control.stats().sessions_truncated == 1
        store.control.check_integrity()
        if not restart_before_rewrite:
            # The engine recomputed turns 3-5; they append after the last good segment.
            res = store.store_turn(SID, keys, src, range(N), TO_SSD)
            assert (res.num_blocks, res.first_block) == (N - GOOD, GOOD)
            _load(store, keys, src, N)
            store.control.check_integrity()
    if restart_before_rewrite:
        with FlatCakeStore.open(tmp_path, SMALL, cfg) as store:
            rec = store.recovery
            assert (rec.num_segments, rec.damaged_segments, rec.damaged_files) == (2, 0, 0)
            assert store.lookup(keys).num_blocks == GOOD
            _load(store, keys, src, GOOD)
            res = store.store_turn(SID, keys, src, range(N), TO_SSD)
            assert (res.num_blocks, res.first_block) == (N - GOOD, GOOD)
            _load(store, keys, src, N)
    after = _segments(path)
    assert [s.file_offset for s in after] == [segs[0].file_offset, segs[1].file_offset,
                                              segs[1].end_offset]
    with FlatCakeStore.open(tmp_path, SMALL, cfg) as store:
        assert store.recovery.num_segments == 3
        _load(store, keys, src, N)
        store.control.check_integrity()
    assert fsck_root(tmp_path).ok


@pytest.mark.parametrize(("damaged_turn", "good", "file0_cut"), [(1, 4, True),
                                                                 (2, 7, False)])
def test_damage_in_an_earlier_file_deletes_the_later_files(tmp_path: Path, damaged_turn: int,
                                                           good: int,
                                                           file0_cut: bool) -> None:
    # 24 KiB spans hold the 4 KiB file header and two 8 KiB segments: turns 1-2 in file
    # 0, turns 3-4 in file 1, turn 5 in file 2.
    cfg = small_config("store.session_file_bytes=24576")
    src, keys = _write(tmp_path, cfg)
    files = _files(tmp_path)
    assert len(files) == 3
    segs = [s for f in files for s in _segments(f)]
    file0_size = files[0].stat().st_size
    with FlatCakeStore.open(tmp_path, SMALL, cfg) as store:
        target = files[0] if damaged_turn < 2 else files[1]
        _flip_data(target, segs[damaged_turn])
        _load(store, keys, src, good, damaged=1)
        assert store.lookup(keys).num_blocks == good
        assert _files(tmp_path) == files[:1]  # later files deleted, not quarantined
        assert not (tmp_path / QUARANTINE_DIR).exists()
        kept = segs[damaged_turn - 1].end_offset if file0_cut else file0_size
        assert files[0].stat().st_size == kept
        ssd = store.inspect()["media"]["ssd"]
        assert (ssd["files"], ssd["segments"]) == (1, damaged_turn)
        assert ssd["used_bytes"] == segs[damaged_turn - 1].end_offset
        store.control.check_integrity()
        store.store_turn(SID, keys, src, range(N), TO_SSD)
        _load(store, keys, src, N)
        store.control.check_integrity()
    with FlatCakeStore.open(tmp_path, SMALL, cfg) as store:
        assert store.recovery.damaged_segments == 0
        _load(store, keys, src, N)
    assert fsck_root(tmp_path).ok


def test_damaged_file_header_found_while_serving_quarantines(tmp_path: Path) -> None:
    cfg = small_config()
    src, keys = _write(tmp_path, cfg)
    (path,) = _files(tmp_path)
    segs = _segments(path)
    with FlatCakeStore.open(tmp_path, SMALL, cfg) as store:
        with open(path, "r+b") as fh:  # the file header rots too
            fh.seek(10)
            fh.write(b"\xff")
        _flip_data(path, segs[2])
        # The turns before the damage passed their checks and were served ...
        _load(store, keys, src, GOOD, damaged=1)
        # ... but a restart could not open the file: the session goes, kept for fsck.
        assert store.lookup(keys).num_blocks == 0
        assert _files(tmp_path) == []
        assert (tmp_path / QUARANTINE_DIR / path.name).exists()
        assert store.inspect()["media"]["ssd"]["used_bytes"] == 0
        store.control.check_integrity()
        # The recomputed KV is stored again from scratch.
        assert store.store_turn(SID, keys, src, range(N), TO_SSD).num_blocks == N
        _load(store, keys, src, N)
    report = fsck_root(tmp_path)  # the quarantine settled it: listed, not a failure
    assert report.ok and not report.clean
    assert [f.state for f in report.files if not f.ok] == ["settled"]


def test_cut_waits_for_a_restore_reading_the_tail(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Restore A holds its window (and its pin on turns 1-5) before reading; restore B
    # finds the damage meanwhile. The cut must wait for A, lookups stop at the damage
    # at once, and a new turn of the session waits to append after the cut.
    cfg = small_config()
    src, keys = _write(tmp_path, cfg)
    (path,) = _files(tmp_path)
    segs = _segments(path)
    size = path.stat().st_size
    armed, entered, gate = threading.Event(), threading.Event(), threading.Event()
    real_run = StagingWindow.run

    def gated_run(self, job, ready):  # type: ignore[no-untyped-def]
        if armed.is_set() and not entered.is_set():
            entered.set()
            gate.wait(10)
        return real_run(self, job, ready)

    monkeypatch.setattr(StagingWindow, "run", gated_run)
    with FlatCakeStore.open(tmp_path, SMALL, cfg) as store:
        _flip_data(path, segs[2])
        armed.set()
        dst_a = empty_kv(SMALL, N)
        handle_a = store.start_load(keys, dst_a, range(N))
        assert entered.wait(10)
        _load(store, keys, src, GOOD, damaged=1)  # restore B, on the other window
        assert store.lookup(keys).num_blocks == GOOD  # a miss from the damage on, now
        assert path.stat().st_size == size  # ... but A still reads the tail: no cut yet
        assert [s["damaged"] for s in store.inspect()["sessions"]] == [True]
        store.control.check_integrity()
        written: list[object] = []
        writer = threading.Thread(target=lambda: written.append(
            store.store_turn(SID, keys, src, range(N), TO_SSD)))
        writer.start()
        writer.join(0.3)
        assert writer.is_alive() and written == []  # waits for the cut
        gate.set()
        assert handle_a.wait(10).num_blocks == GOOD
        writer.join(10)
        assert not writer.is_alive()
        assert [(r.num_blocks, r.first_block) for r in written] == [  # type: ignore[attr-defined]
            (N - GOOD, GOOD)]
        _load(store, keys, src, N)
        store.control.check_integrity()
    assert [s.file_offset for s in _segments(path)] == [
        segs[0].file_offset, segs[1].file_offset, segs[1].end_offset]
