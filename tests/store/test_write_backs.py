"""Not-yet homes written back at memory reclaim (``placement.not_yet_write_back``) by the
embedded store: the SSD segment is written from the home's arena bytes, restores
byte-exact (after a restart too), a write that fails loses nothing, a home's range is
not reused while its write-back is in flight, and the wear counters count it."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
import torch

from flatcake.cio.names import SESSIONS_DIR, session_files_in
from flatcake.cio.writer import SegmentWriter
from flatcake.control.address import Medium
from flatcake.store import FlatCakeStore, TurnSignals
from tests.store.helpers import SMALL, block_bytes, empty_kv, random_kv, session_keys, small_config

FIRST = TurnSignals(turn_index=0, context_tokens=20)  # no sign of reuse: not yet
N = 5  # blocks per turn: 5 x 768 B, one 4 KiB page of the arena
SESSIONS = "abcdefgh"


def config(*more: str) -> Any:
    # 8 pages of host memory, reclaim from 0.9 down to 0.5: the 8th home crosses the
    # high watermark and the 4 oldest homes are written back.
    return small_config("store.memory_capacity_bytes=32768", "reclaim.memory_high=0.9",
                        "reclaim.memory_low=0.5", "placement.not_yet=true",
                        "placement.not_yet_write_back=true", *more)


def fill(store: FlatCakeStore, src: list[torch.Tensor], sessions: str = SESSIONS) -> None:
    """A not-yet first turn of ``N`` blocks per session, each from its own slots."""
    for i, s in enumerate(sessions):
        res = store.store_turn(s, keys_of(s), src, range(N * i, N * i + N), FIRST)
        assert (res.medium, res.rule) == (Medium.MEMORY, "not_yet")


def keys_of(session: str) -> list[bytes]:
    return session_keys(ord(session), N)


def restored(store: FlatCakeStore, session: str, src: list[torch.Tensor]) -> tuple[int, int]:
    """Load ``session``'s turn; its (memory, SSD) blocks, once checked byte-exact."""
    i = SESSIONS.index(session)
    dst = empty_kv(SMALL, N)
    out = store.load(keys_of(session), dst, range(N))
    assert out.num_blocks == N
    assert all(block_bytes(dst, layer, j, "kv_blocks") ==
               block_bytes(src, layer, N * i + j, "kv_blocks")
               for layer in range(SMALL.num_layers) for j in range(N))
    return out.num_memory_blocks, out.num_ssd_blocks


def test_a_written_back_home_restores_byte_exact_from_the_ssd(tmp_path: Path) -> None:
    src = random_kv(SMALL, N * len(SESSIONS))
    with FlatCakeStore.open(tmp_path, SMALL, config()) as store:
        fill(store, src)
        for s in "abcd":  # written back: served from the SSD, the homes freed
            assert restored(store, s, src) == (0, N)
        for s in "efgh":
            assert restored(store, s, src) == (N, 0)
        assert store.control.memory_used_bytes == 4 * 4096
        segs = [store.control.segment(i) for s in "abcd"
                for i in store.control.session(s).ssd_segment_ids]
        assert [seg.num_blocks for seg in segs] == [N] * 4
        # Counted as written once each is durable, as any SSD store.
        assert store.control.ssd_wear().written_bytes == sum(s.total_bytes for s in segs)
        store.control.check_integrity()
    # The segments are on disk like any turn's: a restart serves them.
    with FlatCakeStore.open(tmp_path, SMALL, config()) as store:
        assert store.recovery.num_segments == 4
        for s in "abcd":
            assert restored(store, s, src) == (0, N)


def test_without_write_backs_the_same_homes_are_dropped(tmp_path: Path) -> None:
    src = random_kv(SMALL, N * len(SESSIONS))
    cfg = config("placement.not_yet_write_back=false")
    with FlatCakeStore.open(tmp_path, SMALL, cfg) as store:
        fill(store, src)
        assert store.lookup(keys_of("a")).num_blocks == 0
        assert store.control.ssd_wear().written_bytes == 0


def test_a_write_back_that_fails_loses_nothing(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    src = random_kv(SMALL, N * len(SESSIONS))
    with FlatCakeStore.open(tmp_path, SMALL, config()) as store:
        monkeypatch.setattr(store._exec.writer, "write_ssd_from_memory", no_space)
        fill(store, src)
        # Every home is still served from memory, byte-exact; nothing counts as written.
        for s in SESSIONS:
            assert restored(store, s, src) == (N, 0)
        assert store.control.ssd_wear().written_bytes == 0
        assert store.control.ssd_used_bytes == 0
        assert session_files_in(tmp_path / SESSIONS_DIR) == []
        store.control.check_integrity()
        # Once the disk takes writes again, the next reclaim writes them back.
        monkeypatch.undo()
        store.store_turn("i", session_keys(1000, N), src, range(N), FIRST)
        assert restored(store, "a", src) == (0, N)
        store.control.check_integrity()


def test_reclaim_while_a_write_back_is_in_flight_keeps_its_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = random_kv(SMALL, N * len(SESSIONS))
    seen: list[str] = []
    write = SegmentWriter.write_ssd_from_memory

    with FlatCakeStore.open(tmp_path, SMALL, config()) as store:
        def in_flight(self: SegmentWriter, fd: int, file_offset: int, home: torch.Tensor,
                      *args: Any, **kw: Any) -> Any:
            # While "a"'s home is being written: a reclaim of memory, then more turns.
            if not seen:
                seen.append("a")
                before = home.clone()
                with store._lock:
                    store.control.reclaim()
                    store.control.check_integrity()
                assert store.lookup(keys_of("a")).num_memory_blocks == N
                assert store.control.session("a").num_pins == 1
                assert torch.equal(home, before)  # its range was not reused
            return write(self, fd, file_offset, home, *args, **kw)

        monkeypatch.setattr(SegmentWriter, "write_ssd_from_memory", in_flight)
        fill(store, src)
        assert seen == ["a"]
        assert restored(store, "a", src) == (0, N)
        assert store.control.session("a").num_pins == 0
        store.control.check_integrity()
