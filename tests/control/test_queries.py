"""ControlPlane query methods: what hosts read off the books without reaching into the
index, the SSD space, the arena, the memory copies or the FC-MAS scheduler. Each
scenario stores turns, then asks, and checks the answer against the verbs' results."""

from __future__ import annotations

import random

import pytest

from flatcake.control import ControlPlane
from flatcake.control.address import Medium
from flatcake.control.index import BlockIndex
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


def scanned_newest_turn(cp: ControlPlane, session_id: str) -> int:
    """The session's newest turn the slow way: a scan of its live segments."""
    rec = cp.session(session_id)
    return max((cp.segment(i).turn_index
                for i in (*rec.memory_segment_ids, *rec.ssd_segment_ids)), default=-1)


class TestNewestTurn:
    def test_kept_through_publish_cut_and_reclaim_of_a_long_session(self) -> None:
        """An agent session of hundreds of turns: turns on both media, stores
        completed out of order, failed stores, memory reclaim, cuts at a damaged
        segment (the turns after it stored again), the session dropped. After every
        step the books' newest turn is the scan's."""
        cp, _ = make(memory_pages=16, ssd_pages=8192, span_pages=256)
        rng = random.Random(7)
        seen = []

        def check() -> None:
            seen.append(cp.newest_turn_index("a"))
            assert seen[-1] == scanned_newest_turn(cp, "a")
            cp.check_integrity()

        turn, in_flight = 0, []
        for step in range(1, 601):
            reply = 50 if rng.random() < 0.5 else 5000  # memory or SSD
            plan = cp.prepare_store("a", skeys("a", 2 * (turn + 1)), turn_index=turn,
                                    context_tokens=8 * (turn + 1), prev_reply_tokens=reply)
            turn += 1
            if plan is not None:
                in_flight.append(plan)
            if len(in_flight) > 2 or rng.random() < 0.5:  # the newest may finish first
                rng.shuffle(in_flight)
                cp.complete_store(in_flight.pop(), ok=rng.random() > 0.1)
                cp.take_reclaim_actions()
                check()
            if step % 30:
                continue
            for plan in in_flight:  # nothing in flight: memory reclaim drops its
                cp.complete_store(plan, True)  # memory turns, a cut may go anywhere
            in_flight = []
            check()
            if step % 60:
                cp.reclaim()
                cp.take_reclaim_actions()
            else:
                ssd = cp.session("a").ssd_segment_ids
                damaged = ssd[len(ssd) * 3 // 4]
                assert cp.mark_damaged(damaged)
                cp.truncate_session("a", damaged)
                turn = cp.newest_turn_index("a") + 1  # its later turns stored again
            check()
        stats = cp.stats()
        assert stats.sessions_reclaimed_memory >= 5 and stats.sessions_truncated == 10
        assert len(set(seen)) > 150 and max(seen) > 200
        cp.drop_session("a")
        assert "a" not in cp.session_ids()

    def test_asked_without_reading_a_segment(self, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
        """A lookup asks it every time: O(1), however many turns the session holds."""
        cp, _ = make(ssd_pages=8192, span_pages=256)
        for turn in range(300):
            plan = cp.prepare_store("a", skeys("a", turn + 1), turn_index=turn,
                                    context_tokens=4 * (turn + 1), prev_reply_tokens=5000)
            assert plan is not None
            cp.complete_store(plan, True)
        read = []
        real = BlockIndex.segment
        monkeypatch.setattr(BlockIndex, "segment",
                            lambda self, i: read.append(i) or real(self, i))
        assert cp.newest_turn_index("a") == 299 and read == []
