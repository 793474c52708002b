"""ControlPlane query methods: what hosts read off the books without reaching into the
index, the SSD space, the arena, the memory copies or the FC-MAS scheduler. Each
scenario stores turns, then asks, and checks the answer against the verbs' results."""

from __future__ import annotations

import pytest

from flatcake.control.address import Medium
from tests.control.helpers import K, chat_turn, first_turn, make, skeys


class TestSegmentsAndBlocks:
    def test_segment_locate_and_newest_turn(self) -> None:
        cp, _ = make()
        p0 = first_turn(cp, "s", 4)  # SSD
        p1 = chat_turn(cp, "s", 6, turn=1)  # short previous reply -> memory
        assert p1.medium == Medium.MEMORY
        assert cp.segment(p0.segment.segment_id) is p0.segment
        assert {s.segment_id for s in cp.segments()} == {p0.segment.segment_id,
                                                          p1.segment.segment_id}
        loc = cp.locate(skeys("s", 6)[5])
        assert loc is not None and loc.segment is p1.segment and loc.position == 1
        assert cp.locate(skeys("other", 1)[0]) is None
        assert cp.newest_turn_index("s") == 1
        with pytest.raises(KeyError, match="unknown session_id"):
            cp.newest_turn_index("nobody")

    def test_reclaimed_segment_is_gone(self) -> None:
        cp, _ = make()
        p0 = first_turn(cp, "s", 4)
        cp.drop_session("s")
        with pytest.raises(KeyError):
            cp.segment(p0.segment.segment_id)
        assert list(cp.segments()) == []

    def test_memory_copy_and_its_home(self) -> None:
        cp, _ = make(copy_watermark=0.9)
        p0 = first_turn(cp, "s", 3)
        assert p0.copy is not None
        copy = cp.memory_copy(p0.segment.segment_id)
        assert copy is p0.copy and list(cp.memory_copies()) == [copy]
        assert copy is not None and copy.home_id == p0.segment.segment_id
        assert all(cp.home_segment_id(x) == p0.segment.segment_id for x in copy.pieces)
        assert cp.home_segment_id(p0.segment) == p0.segment.segment_id


class TestFilesAndBudgets:
    def test_files_and_append_pointer(self) -> None:
        cp, _ = make()
        p0 = first_turn(cp, "s", 4)
        assert cp.files_of("s") == [p0.file_id] and cp.files_of("nobody") == []
        end = cp.file_end_bytes(int(p0.file_id or 0))
        assert end == K + p0.segment.total_bytes
        p1 = cp.prepare_store("s", skeys("s", 6), turn_index=1, context_tokens=24,
                              prev_reply_tokens=5000)
        assert p1 is not None and p1.medium == Medium.SSD and p1.file_offset == end

    def test_budgets_follow_the_books(self) -> None:
        cp, _ = make(memory_pages=64, ssd_pages=1024)
        assert (cp.memory_used_bytes, cp.ssd_used_bytes) == (0, 0)
        assert (cp.memory_capacity_bytes, cp.ssd_capacity_bytes) == (64 * K, 1024 * K)
        p0 = first_turn(cp, "s", 4)
        p1 = chat_turn(cp, "s", 6, turn=1)
        st = cp.stats()
        assert cp.ssd_used_bytes == st.ssd_used_bytes == K + p0.segment.total_bytes
        assert cp.memory_used_bytes == st.memory_used_bytes == p1.segment.total_bytes

    def test_reserved_file_id_is_never_handed_out(self) -> None:
        cp, _ = make()
        cp.reserve_file_id(41)
        p0 = first_turn(cp, "s", 2)
        assert p0.file_id == 42


class TestRestoreOrder:
    def test_fc_mas_through_the_plane(self) -> None:
        cp, clock = make()
        first_turn(cp, "a", 4)
        first_turn(cp, "b", 1)
        big = cp.prepare_load("big", skeys("a", 4))
        small = cp.prepare_load("small", skeys("b", 1))
        cp.submit_restore(big)
        clock.advance(1.0)
        cp.submit_restore(small)
        started = [r.request_id for r in cp.next_restores()]
        assert set(started) == {"big", "small"} and cp.restores_in_flight == 2
        assert cp.pop_ready_restore() is None  # nothing restored yet
        cp.restore_done("small")
        ready = cp.pop_ready_restore()
        assert ready is not None and ready.request_id == "small"
        cp.restore_done("big")
        ready = cp.pop_ready_restore()
        assert ready is not None and ready.request_id == "big"
        stats = cp.restore_stats()
        assert (stats.num_submitted, stats.num_restores_done) == (2, 2)
        assert cp.restores_in_flight == 0
        cp.complete_load("big")
        cp.complete_load("small")
        cp.check_integrity()
