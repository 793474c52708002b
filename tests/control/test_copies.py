"""ControlPlane memory copies (spare host memory) as scripted scenarios: made only
under the watermark, published with their home, read by restores instead of the SSD,
dropped first under pressure (never while pinned), and dropped with their home."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from flatcake.clock import ManualClock
from flatcake.control import ControlPlane, StorePlan
from flatcake.control.address import Medium
from flatcake.control.spare import MAX_COPY_PIECES
from flatcake.plan.reads import plan_reads
from tests.control.helpers import K, chat_turn, make, skeys


def agent_turn(cp: ControlPlane, session: str, n: int, turn: int = 1,
               ok: bool = True) -> StorePlan:
    plan = cp.prepare_store(session, skeys(session, n), turn_index=turn,
                            context_tokens=10**6)
    assert plan is not None and plan.medium == Medium.SSD
    cp.complete_store(plan, ok)
    return plan


class TestCopies:
    def test_copy_is_read_instead_of_the_ssd_home(self) -> None:
        cp, _ = make(memory_pages=8, copy_watermark=0.5)
        p = agent_turn(cp, "a", 3, turn=0)
        assert p.copy is not None and len(p.copy.pieces) == 1  # one extent fits it
        assert p.copy.pieces[0].medium == Medium.MEMORY
        assert p.copy.keys == p.segment.keys and p.copy.home_id == p.segment.segment_id
        assert p.segment.segment_id not in p.copy.segment_ids
        # The home is unchanged: the index still maps the keys to the SSD segment.
        loc = cp.locate(skeys("a", 3)[0])
        assert loc is not None and loc.segment is p.segment
        hit = cp.lookup(skeys("a", 3))
        assert (hit.num_blocks, hit.num_memory_blocks, hit.num_ssd_blocks) == (3, 3, 0)
        lp = cp.prepare_load("r", skeys("a", 3))
        assert lp.read_plan.bytes_read == 0 and lp.read_plan.num_copies > 0
        assert cp.restore_request(lp.request_id, 0.0, lp).needs_ssd is False
        cp.complete_load("r")
        st = cp.stats()
        assert (st.num_memory_copies, st.memory_copy_bytes, st.memory_copies_made) == \
            (1, p.copy.total_bytes, 1)
        assert st.memory_used_bytes == p.copy.total_bytes
        cp.check_integrity()

    def test_a_hit_that_crossed_a_process_boundary_is_served_from_its_copy(self) -> None:
        # An engine attached to the node service gets the hit pickled and hands it back.
        cp, _ = make(memory_pages=8, copy_watermark=0.5)
        agent_turn(cp, "a", 3, turn=0)
        hit = pickle.loads(pickle.dumps(cp.lookup(skeys("a", 3))))
        assert hit.num_memory_blocks == 3
        lp = cp.prepare_load("r", hit)
        assert lp.read_plan.bytes_read == 0 and lp.read_plan.num_copies > 0
        cp.complete_load("r")
        cp.check_integrity()

    def test_copies_are_a_cache_of_the_newest_turns(self) -> None:
        # 4 pages, copies up to 1.0: a new copy evicts the oldest session's copy, just
        # the one page it needs (the reclaim hysteresis 0.9 - 0.85 does not apply:
        # each copy dropped early is a restore from SSD that memory could serve).
        cp, clock = make(memory_pages=4, high=0.9, low=0.85, copy_watermark=1.0)
        for t, s in enumerate("abcd"):
            clock.set(float(t))
            assert agent_turn(cp, s, 2, turn=0).copy is not None
        clock.set(9.0)
        e = agent_turn(cp, "e", 2, turn=0)
        assert e.copy is not None
        assert [(a.session_id, a.ssd_segments) for a in cp.take_reclaim_actions()] == \
            [("a", ())]
        assert [cp.lookup(skeys(s, 2)).num_memory_blocks for s in "abcde"] == [0, 2, 2, 2, 2]
        assert cp.lookup(skeys("a", 2)).num_ssd_blocks == 2  # the home stays
        cp.check_integrity()

    def test_never_above_the_watermark_nor_for_memory_homed_bytes(self) -> None:
        cp, clock = make(memory_pages=4, copy_watermark=0.5)
        agent_turn(cp, "a", 2, turn=0)  # a copy: 1 page of the 2 allowed
        chat_turn(cp, "a", 19)  # memory-homed: 17 blocks of 256 bytes = 2 pages
        clock.set(1.0)
        # 3 pages > 2 even without a's copy: no copy, and a's copy stays.
        assert agent_turn(cp, "b", 2, turn=0).copy is None
        assert cp.take_reclaim_actions() == []
        assert cp.lookup(skeys("a", 19)).num_memory_blocks == 19
        off, _ = make(memory_pages=4)
        assert agent_turn(off, "a", 2, turn=0).copy is None
        assert off.stats().memory_used_bytes == 0

    def test_not_visible_before_the_write_and_freed_when_it_fails(self) -> None:
        cp, _ = make(memory_pages=4, copy_watermark=1.0)
        plan = cp.prepare_store("a", skeys("a", 2), turn_index=0, context_tokens=8)
        assert plan is not None and plan.copy is not None
        assert cp.lookup(skeys("a", 2)).num_blocks == 0
        assert cp.stats().memory_used_bytes == K  # reserved while the write runs
        cp.check_integrity()
        cp.complete_store(plan, False)
        assert cp.stats().memory_used_bytes == 0 and cp.stats().num_memory_copies == 0
        cp.check_integrity()

    def test_copies_go_first_under_pressure_oldest_first(self) -> None:
        # 4 pages, watermarks 0.9 / 0.75, copies up to 0.5: a and b get copies.
        cp, clock = make(memory_pages=4, low=0.75, copy_watermark=0.5)
        agent_turn(cp, "a", 2, turn=0)
        clock.set(1.0)
        agent_turn(cp, "b", 2, turn=0)
        clock.set(2.0)
        chat_turn(cp, "b", 4)  # memory-homed: 3 pages
        assert cp.stats().num_memory_copies == 2
        clock.set(3.0)
        # A shared prefix goes to memory: 4 pages > 3.6, copies go down to 3 pages.
        p = cp.prepare_store("c", skeys("c", 2), turn_index=0, context_tokens=8,
                             shared_refcount=2)
        assert p is not None and p.medium == Medium.MEMORY
        cp.complete_store(p, True)
        actions = cp.take_reclaim_actions()
        assert [(a.session_id, len(a.memory_segments), a.ssd_segments) for a in actions] \
            == [("a", 1, ())]
        # a's copy went, not b's memory-homed turn; a still restores from SSD.
        assert cp.lookup(skeys("b", 4)).num_memory_blocks == 4
        hit = cp.lookup(skeys("a", 2))
        assert (hit.num_blocks, hit.num_ssd_blocks) == (2, 2)
        assert cp.stats().sessions_reclaimed_memory == 0
        assert cp.stats().memory_copies_dropped == 1
        cp.check_integrity()

    @pytest.mark.parametrize("threshold", [0, 2])
    def test_a_shared_turn_homed_on_ssd_stays_a_hit_when_memory_fills(
            self, threshold: int) -> None:
        # Five first turns, each shared by two live requests (duplicated prompts), in 4
        # pages with copies up to 1.0. By default (the shared-prefix rule off) each is
        # homed on SSD with a memory copy; the newest copies evict the oldest, whose
        # turns stay hits from SSD. The paper's rule (any sharing) homes them in memory,
        # and reclaim drops the oldest turns: later hits on them are lost.
        cp, clock = make(memory_pages=4, copy_watermark=1.0,
                         shared_refcount_threshold=threshold)
        placed = []
        for t, s in enumerate("abcde"):
            clock.set(float(t))
            p = cp.prepare_store(s, skeys(s, 2), turn_index=0, context_tokens=8,
                                 shared_refcount=2)
            assert p is not None
            placed.append((p.medium, p.placement.rule.value, p.copy is not None))
            cp.complete_store(p, True)
        hits = [cp.lookup(skeys(s, 2)) for s in "abcde"]
        st = cp.stats()
        if threshold == 0:
            # The fifth finds the arena full of copies (memory_full), and takes a's.
            assert placed == [(Medium.SSD, "first_turn", True)] * 4 + \
                [(Medium.SSD, "memory_full", True)]
            assert [(h.num_blocks, h.num_memory_blocks) for h in hits] == \
                [(2, 0), (2, 2), (2, 2), (2, 2), (2, 2)]
            assert (st.sessions_reclaimed_memory, st.memory_copies_dropped) == (0, 1)
        else:
            assert placed == [(Medium.MEMORY, "shared_prefix", False)] * 5
            assert [(h.num_blocks, h.num_memory_blocks) for h in hits] == \
                [(0, 0), (0, 0), (2, 2), (2, 2), (2, 2)]
            assert st.sessions_reclaimed_memory == 2
        cp.check_integrity()

    def test_a_pinned_sessions_copy_stays(self) -> None:
        cp, clock = make(memory_pages=1, copy_watermark=1.0)
        agent_turn(cp, "a", 2, turn=0)  # its copy fills the arena
        lp = cp.prepare_load("reading-a", skeys("a", 2))
        assert lp.hit.runs[0].segment.medium == Medium.MEMORY
        clock.set(1.0)
        agent_turn(cp, "b", 2, turn=0)
        p = cp.prepare_store("b", skeys("b", 4), turn_index=1, context_tokens=16,
                             prev_reply_tokens=10)
        assert p is not None and p.medium == Medium.SSD  # memory_full: a's copy is read
        assert cp.take_reclaim_actions() == []
        cp.check_integrity()
        cp.complete_load("reading-a")
        cp.complete_store(p, True)
        cp.check_integrity()

    def test_copies_go_with_their_home(self) -> None:
        cp, _ = make(memory_pages=8, copy_watermark=1.0)
        first = agent_turn(cp, "a", 2, turn=0)
        later = agent_turn(cp, "a", 4, turn=1)
        assert first.copy is not None and later.copy is not None
        action = cp.truncate_session("a", later.segment.segment_id)
        assert action.memory_segments == later.copy.pieces
        assert cp.lookup(skeys("a", 4)).num_memory_blocks == 2  # first's copy stays
        cp.check_integrity()
        action = cp.drop_session("a")
        assert action.memory_segments == first.copy.pieces and action.session_dropped
        assert cp.stats().memory_used_bytes == 0
        cp.check_integrity()

    def test_stale_hit_with_a_dropped_copy_is_refused(self) -> None:
        cp, _ = make(memory_pages=8, copy_watermark=1.0)
        agent_turn(cp, "a", 2, turn=0)
        hit = cp.lookup(skeys("a", 2))
        cp.drop_session("a")
        agent_turn(cp, "a", 2, turn=0)
        try:
            cp.prepare_load("r", hit)
        except ValueError as exc:
            assert "stale" in str(exc)
        else:
            raise AssertionError("a hit on a dropped copy was accepted")


class TestCopyWrittenAhead:
    def test_readable_before_the_segment_is_durable(self) -> None:
        cp, _ = make(memory_pages=8, copy_watermark=1.0)
        agent_turn(cp, "a", 2, turn=0)
        plan = cp.prepare_store("a", skeys("a", 5), turn_index=1, context_tokens=10**6)
        assert plan is not None and plan.copy is not None
        assert cp.lookup(skeys("a", 5)).num_blocks == 2
        cp.complete_copy(plan)
        hit = cp.lookup(skeys("a", 5))
        assert (hit.num_blocks, hit.num_memory_blocks) == (5, 5)
        assert hit.runs[-1].segment is plan.copy.pieces[0]
        assert cp.locate(skeys("a", 5)[4]) is None  # the home is not published yet
        lp = cp.prepare_load("r", hit)
        assert lp.read_plan.bytes_read == 0
        cp.check_integrity()
        cp.complete_store(plan, True)
        cp.complete_load("r")
        loc = cp.locate(skeys("a", 5)[4])
        assert loc is not None and loc.segment is plan.segment
        assert cp.lookup(skeys("a", 5)).runs[-1].segment is plan.copy.pieces[0]
        cp.check_integrity()

    def test_a_failed_write_leaves_the_copy_as_the_memory_home(self) -> None:
        cp, _ = make(memory_pages=8, copy_watermark=1.0)
        plan = cp.prepare_store("a", skeys("a", 3), turn_index=0, context_tokens=12)
        assert plan is not None and plan.copy is not None
        cp.complete_copy(plan)
        lp = cp.prepare_load("r", skeys("a", 3))  # reads the copy
        cp.complete_store(plan, False)
        assert cp.stats().ssd_used_bytes == 0
        loc = cp.locate(skeys("a", 3)[0])
        assert loc is not None and loc.segment is plan.copy.pieces[0]  # now homed in memory
        assert cp.session("a").memory_bytes == plan.copy.total_bytes
        cp.check_integrity()  # the restore in flight still reads a live segment
        cp.complete_load(lp.request_id)
        with pytest.raises(KeyError, match="no store"):
            cp.complete_copy(plan)


def make_refill(memory_pages: int, copy_watermark: float) -> ControlPlane:
    cp, _ = make(memory_pages=memory_pages, copy_watermark=copy_watermark)
    placement = dataclasses.replace(cp.config.placement, copy_on_restore=True)
    return ControlPlane(cp.geometry, dataclasses.replace(cp.config, placement=placement),
                        ManualClock(), planner=plan_reads)


class TestRefillAndLru:
    def test_a_restore_refills_the_ssd_segments_it_reads_whole(self) -> None:
        cp = make_refill(memory_pages=2, copy_watermark=0.5)
        a = agent_turn(cp, "a", 2, turn=0)
        agent_turn(cp, "b", 2, turn=0)  # its copy pushes a's out (0.5 of 2 pages)
        cp.take_reclaim_actions()
        assert cp.lookup(skeys("a", 2)).num_ssd_blocks == 2
        assert cp.prepare_load("x", skeys("a", 2)).refills == ()  # the host cannot fill
        cp.complete_load("x")
        lp = cp.prepare_load("r", skeys("a", 2), refill=True)
        assert [(h.segment_id, c.home_id, [x.medium for x in c.pieces])
                for h, c in lp.refills] == \
            [(a.segment.segment_id, a.segment.segment_id, [Medium.MEMORY])]
        assert lp.read_plan.bytes_read > 0  # this restore still reads the SSD
        cp.check_integrity()
        cp.complete_load("r", {a.segment.segment_id})
        assert cp.lookup(skeys("a", 2)).num_memory_blocks == 2
        assert cp.lookup(skeys("b", 2)).num_ssd_blocks == 2  # dropped for the refill
        cp.check_integrity()

    def test_an_unfilled_refill_is_freed(self) -> None:
        cp = make_refill(memory_pages=2, copy_watermark=0.5)
        agent_turn(cp, "a", 2, turn=0)
        agent_turn(cp, "b", 2, turn=0)
        lp = cp.prepare_load("r", skeys("a", 2), refill=True)
        assert lp.refills
        cp.complete_load("r")  # the data plane wrote no copy (e.g. a failed read)
        assert cp.lookup(skeys("a", 2)).num_ssd_blocks == 2
        assert cp.stats().memory_used_bytes == 0
        cp.check_integrity()

    def test_copies_go_least_recently_used_first(self) -> None:
        cp, _ = make(memory_pages=3, high=0.9, low=0.85, copy_watermark=1.0)
        for s in "abx":
            agent_turn(cp, s, 2, turn=0)
        cp.complete_load(cp.prepare_load("r", skeys("a", 2)).request_id)  # reads a's copy
        agent_turn(cp, "c", 2, turn=0)  # room for its page: b, the oldest not read, goes
        assert [cp.lookup(skeys(s, 2)).num_memory_blocks for s in "abxc"] == [2, 0, 2, 2]
        cp.check_integrity()

    def test_a_lookup_that_reports_a_copy_makes_it_the_most_recently_used(self) -> None:
        cp, _ = make(memory_pages=3, high=0.9, low=0.85, copy_watermark=1.0)
        for s in "abx":
            agent_turn(cp, s, 2, turn=0)
        assert cp.lookup(skeys("a", 2)).num_memory_blocks == 2  # a request about to use it
        agent_turn(cp, "c", 2, turn=0)
        assert [cp.lookup(skeys(s, 2)).num_memory_blocks for s in "abxc"] == [2, 0, 2, 2]


def test_an_early_copy_is_found_behind_blocks_indexed_meanwhile() -> None:
    """Two turns in flight write the same first block; the first's early copy becomes
    that block's memory home when its segment fails; the second's early copy still
    serves the rest of the prefix (found at its second key)."""
    cp, _ = make(memory_pages=2, ssd_pages=5, span_pages=5, copy_watermark=1.0)
    keys = skeys("s1", 2)
    one = cp.prepare_store("s1", keys[:1], turn_index=0, context_tokens=4)
    two = cp.prepare_store("s1", keys, turn_index=1, context_tokens=8)
    assert one is not None and two is not None and one.copy and two.copy
    assert two.first_block == 0  # block 0 was not published yet
    cp.complete_copy(one)
    cp.complete_store(one, False)  # its copy was readable: it becomes the memory home
    cp.complete_copy(two)
    assert cp.lookup(keys).num_blocks == 2
    cp.complete_store(two, True)
    assert cp.lookup(keys).num_blocks == 2
    cp.check_integrity()


def copy_after_holes(holes: str) -> tuple[ControlPlane, StorePlan, list[str]]:
    """8 pages: one-page copies a..f at pages 0..5 (a the least recently used), the
    sessions ``holes`` leave, then g's 3-page copy: under the watermark, but larger than
    any free extent. Returns the books, g's plan and the sessions whose copies made
    room."""
    cp, clock = make(memory_pages=8, copy_watermark=1.0)
    for t, s in enumerate("abcdef"):
        clock.set(float(t))
        assert agent_turn(cp, s, 2, turn=0).copy is not None
    for s in holes:
        cp.drop_session(s)
    clock.set(9.0)
    g = agent_turn(cp, "g", 40, turn=0)
    dropped = sorted(x.session_id for a in cp.take_reclaim_actions() for x in a.memory_segments)
    cp.check_integrity()
    return cp, g, dropped


class TestFragmentation:
    def test_a_copy_that_fits_in_bytes_but_not_in_one_extent_spans_the_free_extents(
            self) -> None:
        # Holes at pages 1 and 3, pages 6..7 free: g's 40 blocks (256 bytes each) go 32
        # into pages 6..7 and 8 into page 1; no copy is dropped to open one extent.
        cp, g, dropped = copy_after_holes("bd")
        assert dropped == []
        assert g.copy is not None
        assert [(x.offset // K, x.num_blocks) for x in g.copy.pieces] == [(6, 32), (1, 8)]
        assert [cp.lookup(skeys(s, 2)).num_memory_blocks for s in "acef"] == [2, 2, 2, 2]
        hit = cp.lookup(skeys("g", 40))
        assert (hit.num_memory_blocks, hit.num_ssd_blocks) == (40, 0)
        assert [(r.segment.segment_id, r.start_pos, r.num_blocks, r.prefix_start)
                for r in hit.runs] == [(g.copy.pieces[0].segment_id, 0, 32, 0),
                                       (g.copy.pieces[1].segment_id, 0, 8, 32)]
        lp = cp.prepare_load("r", hit)
        assert lp.read_plan.bytes_read == 0  # the whole turn from host memory
        cp.check_integrity()
        cp.complete_load("r")
        # The copy goes whole with its home: every piece's range is free again.
        action = cp.drop_session("g")
        assert action.memory_segments == g.copy.pieces
        assert cp.stats().memory_used_bytes == 4 * K
        cp.check_integrity()

    def test_a_hit_that_starts_inside_a_copy_reads_only_the_pieces_it_needs(self) -> None:
        _cp, g, _ = copy_after_holes("bd")
        assert g.copy is not None
        # A request that holds the first 34 blocks on the GPU reads blocks 34..39, all
        # in the second piece (home positions 32..39 -> its positions 2..7).
        runs = list(g.copy.runs(34, 6, 34))
        assert [(r.segment.segment_id, r.start_pos, r.num_blocks, r.prefix_start)
                for r in runs] == [(g.copy.pieces[1].segment_id, 2, 6, 34)]

    def test_a_copy_scattered_past_the_piece_limit_drops_the_oldest_copies(self) -> None:
        # 34 pages of one-page copies s0..s33, the even ones dropped: 17 one-page holes.
        # A 17-page copy would need 17 pieces (> MAX_COPY_PIECES): the least recently
        # used copy left (s1) goes, which joins pages 0..2, and it fits in 15 pieces.
        assert MAX_COPY_PIECES == 16
        cp, clock = make(memory_pages=34, copy_watermark=1.0)
        names = [f"s{i}" for i in range(34)]
        for t, s in enumerate(names):
            clock.set(float(t))
            assert agent_turn(cp, s, 2, turn=0).copy is not None
        for s in names[::2]:
            cp.drop_session(s)
        clock.set(99.0)
        big = agent_turn(cp, "big", 17 * 16, turn=0)
        dropped = [x.session_id for a in cp.take_reclaim_actions() for x in a.memory_segments]
        assert dropped == ["s1"]
        assert big.copy is not None and len(big.copy.pieces) == 15
        assert big.copy.pieces[0].offset == 0 and big.copy.pieces[0].num_blocks == 48
        assert cp.lookup(skeys("big", 17 * 16)).num_memory_blocks == 17 * 16
        assert [cp.lookup(skeys(s, 2)).num_memory_blocks for s in names[1::2]] == \
            [0] + [2] * 16
        cp.check_integrity()

    def test_a_copy_goes_while_its_session_writes_but_not_while_a_restore_reads_it(
            self) -> None:
        cp, _ = make(memory_pages=3, high=0.9, low=0.85, copy_watermark=1.0)
        for s in "abx":
            agent_turn(cp, s, 2, turn=0)
        load = cp.prepare_load("r", skeys("b", 2))  # reads b's copy
        # a's next turn: a is pinned by its write, yet its old copy is clean and goes
        # (oldest, and one page is all the new copy needs); b's would stay while read.
        plan = cp.prepare_store("a", skeys("a", 4), turn_index=1, context_tokens=10**6)
        assert plan is not None and plan.copy is not None
        assert {x.session_id for a in cp.take_reclaim_actions() for x in a.memory_segments} \
            == {"a"}
        assert [cp.lookup(skeys(s, 2)).num_memory_blocks for s in "abx"] == [0, 2, 2]
        cp.complete_load(load.request_id)
        cp.complete_store(plan, True)
        cp.check_integrity()
