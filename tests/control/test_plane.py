"""ControlPlane: the lifecycle verbs as scripted scenarios, plus the stateful test
(``tests.control.machine``) that reclaim never takes a pinned session, budgets are never
exceeded and the books of every component agree after every step."""

from __future__ import annotations

import pytest
from hypothesis import settings

from flatcake.control import ControlPlane, FileCut, StorePlan
from flatcake.control.address import Medium
from flatcake.control.placement import PlacementRule
from flatcake.errors import CapacityError
from flatcake.layout import SegmentLayout
from tests.control.helpers import K, chat_turn, first_turn, make, skeys
from tests.control.machine import ControlMachine


class TestStoreAndLoad:
    def test_two_turns_then_restore(self) -> None:
        cp, clock = make()
        ks = skeys("s", 8)
        # Turn 0: 5 blocks. First turn -> SSD, in a new session file after its header.
        p0 = cp.prepare_store("s", ks[:5], turn_index=0, context_tokens=20)
        assert p0 is not None and p0.placement.rule == PlacementRule.FIRST_TURN
        assert p0.medium == Medium.SSD and p0.new_file and p0.file_offset == K
        assert p0.first_block == 0 and p0.block_range == range(0, 5)
        assert cp.lookup(ks).num_blocks == 0  # not visible before the write is durable
        cp.complete_store(p0, True)
        # Turn 1: the history + 3 new blocks; a short previous reply -> memory.
        clock.set(1.0)
        p1 = cp.prepare_store("s", ks, turn_index=1, context_tokens=32, prev_reply_tokens=40)
        assert p1 is not None and p1.placement.rule == PlacementRule.SHORT_REPLY
        assert p1.block_range == range(5, 8) and p1.arena_offset == 0
        cp.complete_store(p1, True)
        hit = cp.lookup(ks)
        assert (hit.num_blocks, hit.num_ssd_blocks, hit.num_memory_blocks) == (8, 5, 3)
        # Restore: one SSD read and one arena copy per layer.
        load = cp.prepare_load("req-1", ks)
        assert load.read_plan.num_commands == 2 and load.read_plan.num_copies == 2
        assert load.session_ids == {"s"} and cp.session("s").num_pins == 1
        rr = cp.restore_request(load.request_id, 1.0, load)
        assert rr.needs_ssd and rr.kv_bytes == 2 * 5 * 128
        clock.set(7.0)
        cp.complete_load("req-1")
        assert cp.session("s").num_pins == 0 and cp.session("s").last_access == 7.0
        st_ = cp.stats()
        assert st_.placements_by_rule["first_turn"] == 1
        assert st_.placements_by_rule["short_reply"] == 1
        assert (st_.num_ssd_segments, st_.num_memory_segments, st_.num_keys) == (1, 1, 8)
        cp.check_integrity()

    def test_nothing_new_returns_none(self) -> None:
        cp, _ = make()
        first_turn(cp, "s", 4)
        assert cp.prepare_store("s", skeys("s", 4), turn_index=1, context_tokens=16) is None
        assert cp.stats().stores_in_flight == 0

    def test_turns_append_in_the_session_file(self) -> None:
        cp, _ = make()
        p0 = first_turn(cp, "s", 3)
        p1 = cp.prepare_store("s", skeys("s", 6), turn_index=1, context_tokens=10**6)
        assert p1 is not None and p1.placement.rule == PlacementRule.AGENT_CONTEXT
        assert not p1.new_file and p1.file_id == p0.file_id
        assert p1.file_offset == p0.file_offset + p0.segment.total_bytes  # type: ignore[operator]
        cp.complete_store(p1, True)
        assert len(cp.prepare_load("r", skeys("s", 6)).hit.runs) == 2

    def test_failed_store_frees_its_space_and_is_never_visible(self) -> None:
        cp, _ = make()
        first_turn(cp, "s", 2)
        used = cp.stats().ssd_used_bytes
        p = cp.prepare_store("s", skeys("s", 5), turn_index=1, context_tokens=10**6)
        assert p is not None and cp.stats().ssd_used_bytes > used
        cp.complete_store(p, False)
        assert cp.stats().ssd_used_bytes == used
        assert cp.lookup(skeys("s", 5)).num_blocks == 2
        again = cp.prepare_store("s", skeys("s", 5), turn_index=1, context_tokens=10**6)
        assert again is not None and again.file_offset == p.file_offset  # tail rolled back
        with pytest.raises(KeyError, match="no store in flight"):
            cp.complete_store(p, True)
        cp.check_integrity()

    def test_shared_prefix_goes_to_memory_even_on_a_first_turn(self) -> None:
        cp, _ = make()
        p = cp.prepare_store("sys", skeys("sys", 3), turn_index=0, context_tokens=12,
                             shared_refcount=4)
        assert p is not None and p.medium == Medium.MEMORY
        assert p.placement.rule == PlacementRule.SHARED_PREFIX


class TestReclaim:
    def test_memory_reclaim_drops_the_oldest_memory_segments_only(self) -> None:
        # Arena of 4 pages, watermarks 0.9 / 0.5. Each chat turn needs one page.
        cp, clock = make(memory_pages=4)
        for t, s in enumerate("abc"):
            clock.set(float(t))
            first_turn(cp, s, 2)
            chat_turn(cp, s, 4)
        assert cp.stats().memory_used_bytes == 3 * K
        clock.set(10.0)
        first_turn(cp, "d", 2)
        # d's chat turn would bring memory to 4 pages > 3.6: drop a, then b (to 2 pages).
        p = chat_turn(cp, "d", 4)
        assert p.medium == Medium.MEMORY
        actions = cp.take_reclaim_actions()
        assert [(a.session_id, a.medium) for a in actions] == [("a", Medium.MEMORY),
                                                               ("b", Medium.MEMORY)]
        assert all(a.file_ids == () and not a.session_dropped for a in actions)
        # Never demoted: a's SSD turn is still there, its memory turn is gone.
        hit = cp.lookup(skeys("a", 4))
        assert (hit.num_blocks, hit.num_memory_blocks) == (2, 0)
        assert cp.stats().sessions_reclaimed_memory == 2
        cp.check_integrity()

    def test_memory_reclaim_keeps_the_later_ssd_turns(self) -> None:
        # a: an SSD first turn, a memory chat turn, an SSD turn of another branch (it
        # shares only the first turn) and an SSD agent turn behind the chat turn. Memory
        # reclaim drops the chat turn and nothing else: the branch is still served whole,
        # the agent turn stays published and counted (unreachable: its prefix is gone),
        # no file is cut.
        cp, clock = make(memory_pages=2, high=0.9, low=0.4)
        first = first_turn(cp, "a", 2)
        chat = chat_turn(cp, "a", 4)
        branch = skeys("a", 2) + skeys("a-branch", 3)
        side = cp.prepare_store("a", branch, turn_index=2, context_tokens=10**6)
        agent = cp.prepare_store("a", skeys("a", 6), turn_index=3, context_tokens=10**6)
        assert side is not None and agent is not None
        assert side.medium == agent.medium == Medium.SSD
        cp.complete_store(side, True)
        cp.complete_store(agent, True)
        ssd_bytes = cp.session("a").ssd_bytes
        clock.set(5.0)
        first_turn(cp, "b", 2)
        chat_turn(cp, "b", 4)
        chat_turn(cp, "b", 6, turn=2)  # 2 pages > 1.8: a loses its chat turn
        [action] = cp.take_reclaim_actions()
        assert action.session_id == "a" and action.medium == Medium.MEMORY
        assert action.memory_segments == (chat.segment,)
        assert (action.ssd_segments, action.file_ids, action.cut_files) == ((), (), ())
        assert not action.session_dropped
        hit = cp.lookup(branch)
        assert (hit.num_blocks, hit.num_ssd_blocks) == (5, 5)
        assert cp.lookup(skeys("a", 6)).num_blocks == 2
        assert cp.session("a").ssd_segment_ids == [first.segment.segment_id,
                                                   side.segment.segment_id,
                                                   agent.segment.segment_id]
        assert cp.session("a").ssd_bytes == ssd_bytes
        assert cp.session("a").memory_bytes == 0
        cp.check_integrity()
        # The chat turn stored again (its blocks only): the agent turn is reached again.
        again = chat_turn(cp, "a", 4, turn=4)
        assert again.first_block == 2 and again.segment.keys == tuple(skeys("a", 4)[2:])
        hit = cp.lookup(skeys("a", 6))
        assert (hit.num_blocks, hit.num_ssd_blocks) == (6, 4)
        cp.check_integrity()

    def test_memory_full_falls_back_to_ssd(self) -> None:
        cp, clock = make(memory_pages=1)
        first_turn(cp, "a", 2)
        chat_turn(cp, "a", 4)
        cp.prepare_load("reading-a", skeys("a", 4))  # pins a: its memory cannot go
        clock.set(1.0)
        first_turn(cp, "b", 2)
        p = cp.prepare_store("b", skeys("b", 4), turn_index=1, context_tokens=16,
                             prev_reply_tokens=10)
        assert p is not None and p.medium == Medium.SSD
        assert p.placement.rule == PlacementRule.MEMORY_FULL
        assert cp.take_reclaim_actions() == []

    def test_ssd_reclaim_skips_a_session_under_restore(self) -> None:
        # Each first turn of 2 blocks takes a 4 KiB file header + an 8 KiB segment, so
        # a, b, c use 9 of 12 pages; d would bring 12 > 10.8: drop to 6, skipping a.
        cp, clock = make(ssd_pages=12, high=0.9, low=0.5)
        for t, s in enumerate("abc"):
            clock.set(float(t))
            first_turn(cp, s, 2)
        cp.prepare_load("reading-a", skeys("a", 2))  # a is the oldest but pinned
        clock.set(5.0)
        p = cp.prepare_store("d", skeys("d", 2), turn_index=0, context_tokens=8)
        assert p is not None
        actions = cp.take_reclaim_actions()
        dropped = [a.session_id for a in actions]
        assert "a" not in dropped and dropped == ["b", "c"]
        assert all(a.session_dropped and len(a.file_ids) == 1 for a in actions)
        assert cp.lookup(skeys("a", 2)).num_blocks == 2
        assert cp.stats().ssd_used_bytes <= cp.stats().ssd_capacity_bytes
        cp.check_integrity()

    def test_capacity_error_when_nothing_can_be_reclaimed(self) -> None:
        cp, _ = make(ssd_pages=4, memory_pages=0)
        first_turn(cp, "a", 2)
        cp.prepare_load("r", skeys("a", 2))
        with pytest.raises(CapacityError, match="ssd_capacity_bytes"):
            cp.prepare_store("b", skeys("b", 2), turn_index=0, context_tokens=8)
        assert cp.stats().stores_rejected == 1
        assert "b" not in cp.session_ids()  # the failed attempt left nothing behind
        cp.check_integrity()

    def test_spans_run_out_before_bytes_reclaim_the_oldest_sessions(self) -> None:
        # The SSD space maps 2**48 / session_file_bytes files: 8 spans of 2**45 bytes
        # here, however much budget is left. Past 0.9 of them (the 8th file) sessions
        # go oldest first down to 0.5 of the spans, like bytes.
        cp, clock = make(ssd_pages=1 << 20, span_pages=(1 << 45) // K, high=0.9, low=0.5)
        for t in range(20):
            clock.set(float(t))
            first_turn(cp, f"s{t:02d}", 2)
            assert cp.stats().num_files <= 7
            cp.check_integrity()
        stats = cp.stats()
        assert stats.stores_rejected == 0 and stats.sessions_reclaimed_ssd > 0
        assert stats.num_sessions + stats.sessions_reclaimed_ssd == 20
        assert stats.ssd_used_bytes < 0.01 * stats.ssd_capacity_bytes
        live = set(cp.session_ids())
        assert "s19" in live and "s00" not in live
        assert all(cp.lookup(skeys(s, 2)).num_blocks == 2 for s in live)
        assert all(a.session_dropped and a.file_ids for a in cp.take_reclaim_actions())

    def test_spans_all_pinned_is_a_clear_error(self) -> None:
        cp, clock = make(ssd_pages=1 << 20, span_pages=(1 << 46) // K, memory_pages=0)
        for t in range(4):
            clock.set(float(t))
            first_turn(cp, f"s{t}", 2)
            cp.prepare_load(f"r{t}", skeys(f"s{t}", 2))
        with pytest.raises(CapacityError, match="session file spans"):
            cp.prepare_store("new", skeys("new", 2), turn_index=0, context_tokens=8)
        assert cp.stats().stores_rejected == 1
        assert "new" not in cp.session_ids()
        cp.check_integrity()

    def test_explicit_reclaim_returns_pending_actions(self) -> None:
        cp, clock = make(memory_pages=4)
        for t, s in enumerate("abcd"):
            clock.set(float(t))
            first_turn(cp, s, 2)
        assert cp.reclaim() == []  # SSD far below its watermark
        # Under a watermark every store crosses (the config is fixed at construction),
        # each store drops the sessions before it; reclaim() returns those actions with
        # its own (the last session, unpinned once its write completed).
        cp, clock = make(memory_pages=4, high=0.001, low=0.0)
        for t, s in enumerate("abcd"):
            clock.set(float(t))
            first_turn(cp, s, 2)
        dropped = [a.session_id for a in cp.reclaim()]
        assert dropped == ["a", "b", "c", "d"]
        assert cp.stats().ssd_used_bytes == 0 and cp.stats().num_sessions == 0

    def test_drop_session(self) -> None:
        cp, _ = make()
        p = first_turn(cp, "s", 2)
        chat_turn(cp, "s", 3)
        with pytest.raises(KeyError, match="'nope'"):
            cp.drop_session("nope")
        cp.prepare_load("r", skeys("s", 3))
        with pytest.raises(ValueError, match="'s' is pinned"):
            cp.drop_session("s")
        cp.complete_load("r")
        action = cp.drop_session("s")
        assert action.file_ids == (p.file_id,) and action.session_dropped
        assert len(action.memory_segments) == 1 and len(action.ssd_segments) == 1
        assert cp.lookup(skeys("s", 3)).num_blocks == 0
        assert cp.stats().memory_used_bytes == cp.stats().ssd_used_bytes == 0
        with pytest.raises(KeyError, match="'s'"):
            cp.touch("s")


def ssd_turns(cp: ControlPlane, session: str, sizes: list[int]) -> list[StorePlan]:
    """Store one SSD turn per entry of ``sizes`` (new blocks per turn)."""
    plans, done = [], 0
    for turn, n in enumerate(sizes):
        done += n
        p = cp.prepare_store(session, skeys(session, done), turn_index=turn,
                             context_tokens=10**6)
        assert p is not None and p.medium == Medium.SSD
        cp.complete_store(p, True)
        plans.append(p)
    return plans


class TestTruncate:
    """A damaged segment cuts its session there; the earlier segments stay."""

    def test_cut_drops_the_segment_and_the_later_ones_keeps_the_earlier(self) -> None:
        cp, _ = make()
        p = ssd_turns(cp, "s", [2, 1, 3, 1, 2])  # one file; 9 blocks
        m = chat_turn(cp, "s", 11, turn=5)  # a memory turn after them
        used = cp.stats().ssd_used_bytes
        action = cp.truncate_session("s", p[2].segment.segment_id)
        assert [s.segment_id for s in action.ssd_segments] == [
            q.segment.segment_id for q in p[2:]]
        assert action.cut_files == (FileCut(p[0].file_id, p[2].file_offset),)  # type: ignore[arg-type]
        # The later memory turn goes too: it would sit behind the hole.
        assert action.file_ids == () and action.memory_segments == (m.segment,)
        assert not action.session_dropped and action.medium is None
        hit = cp.lookup(skeys("s", 11))
        assert (hit.num_blocks, hit.num_ssd_blocks) == (3, 3)  # turns 1-2
        freed = sum(q.segment.total_bytes for q in p[2:])
        assert cp.stats().ssd_used_bytes == used - freed
        assert cp.session("s").ssd_bytes == K + p[0].segment.total_bytes \
            + p[1].segment.total_bytes
        assert cp.session("s").memory_segment_ids == []
        assert cp.stats().memory_used_bytes == 0
        assert cp.stats().sessions_truncated == 1
        cp.check_integrity()
        # The recomputed turns append right after the last good segment.
        again = cp.prepare_store("s", skeys("s", 11), turn_index=6, context_tokens=10**6)
        assert again is not None and again.first_block == 3
        assert (again.file_id, again.file_offset) == (p[2].file_id, p[2].file_offset)
        cp.complete_store(again, True)
        assert cp.lookup(skeys("s", 11)).num_blocks == 11
        cp.check_integrity()

    def test_cut_releases_later_files_and_empty_ones(self) -> None:
        # Every turn is a 2-page segment; a 5-page span holds a file header and two.
        cp, _ = make(span_pages=5)
        p = ssd_turns(cp, "s", [1, 5, 5, 5, 5])
        files = cp.files_of("s")
        assert [q.file_id for q in p] == [files[0]] * 2 + [files[1]] * 2 + [files[2]]
        action = cp.truncate_session("s", p[2].segment.segment_id)  # first of file 1
        assert action.file_ids == (files[1], files[2]) and action.cut_files == ()
        assert cp.files_of("s") == [files[0]]
        assert cp.lookup(skeys("s", 21)).num_blocks == 6
        cp.check_integrity()
        # Cut at the very first segment: nothing is left, the session is forgotten.
        action = cp.truncate_session("s", p[0].segment.segment_id)
        assert action.file_ids == (files[0],) and action.session_dropped
        assert cp.session_ids() == [] and cp.stats().ssd_used_bytes == 0
        cp.check_integrity()

    def test_cut_waits_for_restores_and_writes_of_the_tail(self) -> None:
        cp, _ = make()
        p = ssd_turns(cp, "s", [2, 2, 2])
        tail = p[1].segment.segment_id
        cp.prepare_load("head", skeys("s", 2))  # reads turn 1 only: no conflict
        assert not cp.tail_in_use("s", tail)
        cp.prepare_load("all", skeys("s", 6))
        assert cp.tail_in_use("s", tail)
        with pytest.raises(ValueError, match=r"'s'.*in flight"):
            cp.truncate_session("s", tail)
        cp.complete_load("all")
        w = cp.prepare_store("s", skeys("s", 8), turn_index=3, context_tokens=10**6)
        assert w is not None and cp.tail_in_use("s", tail)  # a write lands in the tail
        cp.complete_store(w, True)
        action = cp.truncate_session("s", tail)
        assert len(action.ssd_segments) == 3
        assert cp.lookup(skeys("s", 8)).num_blocks == 2
        cp.complete_load("head")
        cp.check_integrity()

    def test_bad_input(self) -> None:
        cp, _ = make()
        p = ssd_turns(cp, "s", [2])
        m = chat_turn(cp, "s", 3)
        ssd_turns(cp, "t", [1])
        with pytest.raises(KeyError, match="'nope'"):
            cp.truncate_session("nope", p[0].segment.segment_id)
        with pytest.raises(KeyError, match="not a live SSD segment"):
            cp.truncate_session("s", m.segment.segment_id)
        with pytest.raises(KeyError, match="not a live SSD segment"):
            cp.truncate_session("t", p[0].segment.segment_id)
        with pytest.raises(KeyError, match="not a live SSD segment"):
            cp.tail_in_use("s", 999)
        cp.check_integrity()


class TestRecovery:
    def test_rebuild_from_scanned_segments(self) -> None:
        cp, clock = make(span_pages=4)
        found = []
        for t, s in enumerate(["x", "y"]):
            clock.set(float(t))
            for turn, n in enumerate((3, 7, 9)):  # y outgrows its first span
                p = cp.prepare_store(s, skeys(s, n), turn_index=turn, context_tokens=10**6)
                assert p is not None and p.medium == Medium.SSD
                cp.complete_store(p, True)
                found.append(p)
        fresh, _ = make(span_pages=4)
        for p in found:
            seg = p.segment
            base = seg.offset - seg.file_offset  # type: ignore[operator]
            got = fresh.recover_segment(p.session_id, seg.file_id, seg.file_offset,  # type: ignore[arg-type]
                                        seg.layout, seg.keys, seg.turn_index,
                                        virtual_base=base)
            assert got.base_address == seg.base_address  # same addresses after restart
        for s in ("x", "y"):
            a, b = cp.lookup(skeys(s, 9)), fresh.lookup(skeys(s, 9))
            assert (a.num_blocks, a.num_ssd_blocks) == (b.num_blocks, b.num_ssd_blocks) == (9, 9)
        assert fresh.stats().ssd_used_bytes == cp.stats().ssd_used_bytes
        fresh.check_integrity()
        # New writes continue after the recovered data, in fresh file ids.
        p = fresh.prepare_store("x", skeys("x", 10), turn_index=3, context_tokens=10**6)
        assert p is not None
        last_x = max((q for q in found if q.session_id == "x"),
                     key=lambda q: (q.file_id, q.file_offset))
        assert (p.file_id, p.file_offset) > (last_x.file_id, last_x.file_offset)  # type: ignore[operator]
        fresh.complete_store(p, True)
        fresh.check_integrity()

    def test_recover_rejects_a_foreign_geometry(self) -> None:
        cp, _ = make()
        with pytest.raises(ValueError, match="geometry"):
            cp.recover_segment("s", 0, K, SegmentLayout.for_ssd(1, (128,) * 3), skeys("s", 1), 0)
        with pytest.raises(ValueError, match=r"keys\[0\]"):
            cp.recover_segment("s", 0, K, SegmentLayout.for_ssd(1, (128,) * 2), [b"x"], 0)


class TestBadInput:
    def test_session_ids_and_keys(self) -> None:
        cp, _ = make()
        with pytest.raises(ValueError, match="session_id"):
            cp.prepare_store("", skeys("s", 1), turn_index=0, context_tokens=4)
        with pytest.raises(ValueError, match="session_id"):
            cp.prepare_store(7, skeys("s", 1), turn_index=0, context_tokens=4)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"keys\[1\]"):
            cp.prepare_store("s", [skeys("s", 1)[0], b"short"], turn_index=0, context_tokens=4)
        with pytest.raises(ValueError, match="turn_index"):
            cp.prepare_store("s", skeys("s", 1), turn_index=-1, context_tokens=4)
        assert cp.session_ids() == []  # nothing half-created

    def test_loads(self) -> None:
        cp, _ = make()
        first_turn(cp, "s", 2)
        hit = cp.lookup(skeys("s", 2))
        cp.prepare_load("r", hit)
        with pytest.raises(ValueError, match="'r' already"):
            cp.prepare_load("r", hit)
        cp.complete_load("r")
        with pytest.raises(KeyError, match="'r'"):
            cp.complete_load("r")
        cp.drop_session("s")
        with pytest.raises(ValueError, match="stale PrefixHit"):
            cp.prepare_load("r2", hit)

    def test_geometry_type(self) -> None:
        with pytest.raises(ValueError, match="geometry"):
            ControlPlane("llama")  # type: ignore[arg-type]


TestControlMachine = ControlMachine.TestCase
TestControlMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_shared_refcount_is_taken_at_the_first_block_written() -> None:
    """A callable refcount is asked about the first block prepare_store writes, which
    moves when another request stored part of the prompt meanwhile."""
    cp, _ = make()
    keys = skeys("p", 6)
    asked: list[int] = []

    def shared(i: int) -> int:
        asked.append(i)
        return 5 if i < 2 else 1  # blocks 0-1: a prompt many live requests share

    a = cp.prepare_store("a", keys[:2], turn_index=0, context_tokens=8,
                         shared_refcount=shared)
    assert a is not None and a.placement.rule == PlacementRule.SHARED_PREFIX
    cp.complete_store(a, True)
    b = cp.prepare_store("b", keys, turn_index=0, context_tokens=24, shared_refcount=shared)
    assert b is not None and b.placement.rule == PlacementRule.FIRST_TURN
    assert asked == [0, 2]
    with pytest.raises(ValueError, match="shared_refcount"):
        cp.prepare_store("c", skeys("c", 1), turn_index=0, context_tokens=4,
                         shared_refcount=lambda i: -1)
