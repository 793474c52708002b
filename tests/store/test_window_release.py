"""Releasing superseded window rows: once a newer turn is durable, the older turns'
sliding-window rows are punched out of the session file, so the session's allocated
bytes (st_blocks, on a real file) in its sliding layers stay within its window as it
grows; restores stay byte for byte through both read paths, a hit ending at an older
turn is cut back, a restart rebuilds the same books from the holes, and a crash before
the punch loses nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from flatcake.cio.files import SessionFiles
from flatcake.cli import main
from flatcake.config import FlatCakeConfig
from flatcake.geometry import KVGeometry
from flatcake.layout import ALIGN, align_up
from flatcake.store import FlatCakeStore, TurnSignals
from flatcake.store.inspect import inspect_root
from tests.store.helpers import paged, session_keys, small_config
from tests.store.window_helpers import (
    GEOMETRIES,
    WINDOW,
    assert_restored,
    sliding_pages_allocated,
    the_file,
)


@pytest.mark.parametrize("path_name", sorted(GEOMETRIES))
def test_a_sessions_sliding_bytes_stay_within_its_window(tmp_path: Path,
                                                         path_name: str) -> None:
    g = GEOMETRIES[path_name]
    row = g.layer_block_bytes[2]
    turns, per_turn = 16, 5
    total = turns * per_turn
    src = paged(g, total, seed=21)
    keys = session_keys(21, total, g)
    slots = list(range(total - 1, -1, -1))
    with FlatCakeStore.open(tmp_path, g, at_once()) as store:
        for t in range(turns):
            n = (t + 1) * per_turn
            res = store.store_turn("s", keys[:n], src, range(n), TurnSignals(t, 0))
            assert res.medium is not None and res.medium.name == "SSD"
            path = the_file(tmp_path)
            # Pages holding sliding rows only: the newest turn's window, never more.
            assert sliding_pages_allocated(store, path) <= WINDOW * 2 * row
            # The whole file on disk (st_blocks): the file header, each turn's header
            # and full layers, plus the newest window and at most two pages per turn
            # that the sliding rows share with the full layers or the padding.
            seg = next(iter(store.control.segments()))
            full = align_up(seg.layout.header_bytes + per_turn * 2 * 8192)
            allocated = os.stat(path).st_blocks * 512
            assert allocated <= ALIGN + (t + 1) * (full + 2 * ALIGN) + WINDOW * 2 * row
        assert store.control.stats().window_bytes_released > 0
        store.control.check_integrity()
        assert store.fsck().clean  # released layers are not checked: they are gone
        dst = paged(g, total)
        res = store.load(keys, dst, slots)
        assert (res.num_blocks, res.damaged_segments, res.read_path) == \
            (total, 0, path_name)
        assert res.useful_bytes == total * 2 * 8192 + WINDOW * 2 * row
        assert_restored(dst, src, slots, total)
        before = sorted((s.file_offset, s.layout.released) for s in store.control.segments())
    assert [r for _, r in before] == [(2, 3)] * (turns - 1) + [()]
    with FlatCakeStore.open(tmp_path, g, at_once()) as store:  # a restart
        after = sorted((s.file_offset, s.layout.released) for s in store.control.segments())
        assert after == before  # the holes are the record: the same books
        dst = paged(g, total)
        res = store.load(keys, dst, slots)
        assert (res.num_blocks, res.damaged_segments) == (total, 0)
        assert_restored(dst, src, slots, total)
        assert store.lookup(keys[:per_turn * 8]).num_blocks == 0  # an older turn: cut back


def three_turns(root: Path, g: KVGeometry, seed: int, cfg: FlatCakeConfig
                ) -> tuple[list[torch.Tensor], list[bytes]]:
    """Session ``s`` stored at ``root`` as three turns of 5 blocks (then closed): its
    source KV and keys."""
    src, keys = paged(g, 15, seed=seed), session_keys(seed, 15, g)
    with FlatCakeStore.open(root, g, cfg) as store:
        for t, end in enumerate((5, 10, 15)):
            store.store_turn("s", keys[:end], src, range(end), TurnSignals(t, 0))
    return src, keys


def copies_on_restore() -> FlatCakeConfig:
    """Memory copies made by restores, as many as memory holds."""
    return small_config("placement.memory_copy_watermark=1.0",
                        "placement.copy_on_restore=true")


def at_once(*overrides: str) -> FlatCakeConfig:
    """The store's config with superseded rows released as soon as a newer turn is
    durable (the release and punch these tests follow; by default rows wait until
    the SSD needs the space), and no stride rows (a turn keeps them past newer ones)."""
    return small_config("store.release_windows_at_once=true",
                        "store.window_row_stride_tokens=0", *overrides)


def test_a_hit_ending_at_an_older_turn_is_cut_back_to_a_held_window(
        tmp_path: Path) -> None:
    g = GEOMETRIES["staging"]
    src = paged(g, 20, seed=22)
    keys = session_keys(22, 20, g)
    slots = [(7 * b + 3) % 20 for b in range(20)]
    with FlatCakeStore.open(tmp_path, g, at_once()) as store:
        for t, end in enumerate((5, 10, 15, 16)):
            store.store_turn("s", keys[:end], src, range(end), TurnSignals(t, 0))
        # The newest turn adds 1 block: its window [13, 16) needs 2 rows of the turn
        # ending at 15, which keeps them; the turns ending at 5 and 10 are released.
        released = [s.layout.released for s in store.control.segments()]
        assert released == [(2, 3), (2, 3), (), ()]
        assert store.lookup(keys[:16]).num_blocks == 16
        assert store.lookup(keys[:15]).num_blocks == 15  # a branch off turn 2: served
        assert store.lookup(keys[:10]).num_blocks == 0  # off turn 1: its window is gone
        assert store.lookup(keys[:12]).num_blocks == 0
        for end in (15, 16):
            dst = paged(g, 20)
            res = store.load(keys[:end], dst, slots)
            assert (res.num_blocks, res.damaged_segments) == (end, 0)
            assert_restored(dst, src, slots, end)
        dst = paged(g, 20)
        assert store.load(keys[:12], dst, slots).num_blocks == 0
        assert not any(t.any() for t in dst)
    with FlatCakeStore.open(tmp_path, g, small_config(
            "store.release_old_windows=false")) as store:
        # Off: what was released stays so (the holes), nothing more is.
        assert [s.layout.released for s in store.control.segments()] == released
        store.store_turn("s", keys[:20], src, range(20), TurnSignals(4, 0))
        assert [s.layout.released for s in store.control.segments()] == [*released, ()]
        assert store.lookup(keys[:15]).num_blocks == 15


def test_a_crash_before_the_punch_loses_nothing(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    g = GEOMETRIES["staging"]
    src = paged(g, 20, seed=24)
    keys = session_keys(24, 20, g)
    slots = list(range(20))
    # The books release the rows, the process dies before the file is punched.
    monkeypatch.setattr(SessionFiles, "release", lambda self, file_id, pages: 0)
    with FlatCakeStore.open(tmp_path, g, at_once()) as store:
        for t, end in enumerate((5, 10, 15)):
            store.store_turn("s", keys[:end], src, range(end), TurnSignals(t, 0))
        books = [s.layout.released for s in store.control.segments()]
        assert books == [(2, 3), (2, 3), ()]
    path = the_file(tmp_path)
    whole = os.stat(path).st_blocks
    with FlatCakeStore.open(tmp_path, g, small_config(
            "store.release_old_windows=false")) as store:
        assert store.fsck().clean  # nothing punched: every row there, and checked
        assert [s.layout.released for s in store.control.segments()] == [(), (), ()]
    monkeypatch.undo()
    with FlatCakeStore.open(tmp_path, g, at_once()) as store:
        # The restart releases them again (the same books) and punches them now.
        assert [s.layout.released for s in store.control.segments()] == books
        assert os.stat(path).st_blocks < whole
        assert store.fsck().clean
        for end, served in ((5, 0), (10, 0), (15, 15)):
            dst = paged(g, 20)
            res = store.load(keys[:end], dst, slots)
            assert (res.num_blocks, res.damaged_segments) == (served, 0)
            assert_restored(dst, src, slots, served)
        # The next turn releases the one before it.
        store.store_turn("s", keys[:20], src, range(20), TurnSignals(3, 0))
        assert [s.layout.released for s in store.control.segments()] == \
            [(2, 3), (2, 3), (2, 3), ()]
        assert store.fsck().clean
    with FlatCakeStore.open(tmp_path, g, at_once()) as store:
        assert [s.layout.released for s in store.control.segments()] == \
            [(2, 3), (2, 3), (2, 3), ()]


def test_inspect_shows_the_released_bytes(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    g = GEOMETRIES["zero-copy"]
    src = paged(g, 12, seed=25)
    keys = session_keys(25, 12, g)
    with FlatCakeStore.open(tmp_path, g, at_once()) as store:
        for t, end in enumerate((4, 8, 12)):
            store.store_turn("s", keys[:end], src, range(end), TurnSignals(t, 0))
    kinds = inspect_root(tmp_path)["layer_kinds"]
    # Each turn wrote 3 of its 4 blocks per sliding layer; two turns were released.
    assert kinds[1] == {"kind": "sliding", "stored_bytes": 3 * 2 * 4096,
                        "saved_bytes": 3 * 2 * 4096, "released_bytes": 2 * 3 * 2 * 4096}
    report = inspect_root(tmp_path)["media"]["ssd"]
    # st_blocks drop by the released rows (one page may go to the filesystem's own
    # extent records of the file).
    gone = report["file_bytes_on_disk"] - report["file_bytes_allocated"]
    assert 2 * 3 * 2 * 4096 - ALIGN <= gone <= 2 * 3 * 2 * 4096
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "sliding layers on SSD: 24.00 KiB (24.00 KiB saved: only the window is " \
           "stored; 48.00 KiB released: older turns' windows)" in out


def test_a_copy_made_on_restore_holds_no_released_rows(tmp_path: Path) -> None:
    """copy_on_restore: a released turn's memory copy (written from a restore, which
    does not read its window rows) claims none of them, so a hit ending there is still
    cut back rather than served the slots' stale bytes."""
    g = GEOMETRIES["staging"]
    src, keys = three_turns(tmp_path, g, 26, at_once())
    with FlatCakeStore.open(tmp_path, g, copies_on_restore()) as store:  # no copies yet
        dst = paged(g, 15)
        first = store.load(keys, dst, range(15))
        assert (first.num_ssd_blocks, first.damaged_segments) == (15, 0)
        assert store.control.stats().num_memory_copies == 3
        assert store.lookup(keys).num_memory_blocks == 15
        assert store.lookup(keys[:10]).num_blocks == 0
        dst = paged(g, 15)
        again = store.load(keys, dst, range(15))
        assert (again.num_blocks, again.bytes_read) == (15, 0)
        assert_restored(dst, src, list(range(15)), 15)
        store.control.check_integrity()


def test_copies_made_when_stored_keep_serving_their_rows(tmp_path: Path) -> None:
    """A memory copy written with its turn holds the real rows: while it lives, a hit
    ending at that turn is served from it, byte for byte, though its home's rows on
    SSD are released."""
    g = GEOMETRIES["staging"]
    src = paged(g, 15, seed=28)
    keys = session_keys(28, 15, g)
    cfg = at_once("placement.memory_copy_watermark=1.0")
    with FlatCakeStore.open(tmp_path, g, cfg) as store:
        for t, end in enumerate((5, 10, 15)):
            store.store_turn("s", keys[:end], src, range(end), TurnSignals(t, 0))
        assert [s.layout.released for s in store.control.segments()] == \
            [(2, 3), (2, 3), ()]
        assert store.control.stats().num_memory_copies == 3
        store.control.check_integrity()
        dst = paged(g, 15)
        res = store.load(keys[:10], dst, range(15))
        assert (res.num_blocks, res.bytes_read, res.damaged_segments) == (10, 0, 0)
        assert_restored(dst, src, list(range(15)), 10)


def test_a_copy_made_on_restore_claims_no_rows_the_restore_did_not_read(
        tmp_path: Path) -> None:
    """copy_on_restore with superseded rows kept (not released): a restore reads the
    window at its hit's end only, so the copies it fills of the older turns hold none of
    their window rows; a hit ending at an older turn is served from its SSD rows, byte
    for byte, never from a copy's unread slots."""
    g = GEOMETRIES["staging"]
    src, keys = three_turns(tmp_path, g, 27, small_config())
    with FlatCakeStore.open(tmp_path, g, copies_on_restore()) as store:  # no copies yet
        first = store.load(keys, paged(g, 15), range(15))
        assert (first.num_ssd_blocks, first.damaged_segments) == (15, 0)
        dst = paged(g, 15)
        res = store.load(keys[:10], dst, range(15))
        assert (res.num_blocks, res.damaged_segments) == (10, 0)
        assert_restored(dst, src, list(range(15)), 10)
        store.control.check_integrity()


@pytest.mark.parametrize("path_name", sorted(GEOMETRIES))
def test_a_turn_with_stride_rows_restores_byte_for_byte(tmp_path: Path,
                                                        path_name: str) -> None:
    """A turn keeping rows at stride points (``store.window_row_stride_tokens``): a hit
    ending at its end or at a stride point inside it restores byte for byte, live and
    after a restart, reading the sliding layers' window at the hit's end only; one
    ending between stride points is cut back to the last."""
    g = GEOMETRIES[path_name]
    src = paged(g, 15, seed=29)
    keys = session_keys(29, 15, g)
    cfg = small_config("store.window_row_stride_tokens=96")  # 6 blocks of 16 tokens
    with FlatCakeStore.open(tmp_path, g, cfg) as store:
        store.store_turn("s", keys[:15], src, range(15), TurnSignals(0, 0))
        assert [s.layout.ends for s in store.control.segments()] == [((6, 6), (12, 12))]
    for _ in range(2):  # live, then after a restart
        with FlatCakeStore.open(tmp_path, g, cfg) as store:
            for end, served in ((15, 15), (12, 12), (10, 6), (6, 6), (5, 0)):
                dst = paged(g, 17)
                res = store.load(keys[:end] + session_keys(30, 2, g), dst, range(17))
                assert (res.num_blocks, res.damaged_segments) == (served, 0), end
                if served:
                    assert_restored(dst, src, list(range(15)), served)
            store.control.check_integrity()
