"""Host arena and SSD virtual space: hard budgets, coalescing, fixed spans, range lookup."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from flatcake.control.alloc import HostArena
from flatcake.control.ssd_space import SsdSpace
from flatcake.errors import CapacityError

K = 4096


class TestHostArena:
    def test_alloc_free_coalesce(self) -> None:
        a = HostArena(10 * K)
        x, y, z = a.alloc(K), a.alloc(2 * K), a.alloc(K)
        assert (x, y, z) == (0, K, 3 * K) and a.used_bytes == 4 * K
        a.free(y)
        a.free(x)  # merges with y's hole
        assert a.largest_free_bytes == 6 * K  # the tail after z
        assert a.alloc(3 * K) == 0  # fits in the coalesced 0..3K hole
        a.free(z)
        a.check_integrity()

    def test_best_fit_picks_the_smallest_hole(self) -> None:
        a = HostArena(10 * K)
        offs = [a.alloc(K) for _ in range(10)]
        a.free(offs[1])  # hole of 1 at 1K
        a.free(offs[4])
        a.free(offs[5])  # hole of 2 at 4K
        assert a.alloc(2 * K) == 4 * K
        assert a.alloc(K) == K

    def test_sizes_round_up_to_alignment(self) -> None:
        a = HostArena(3 * K + 100)
        assert a.alloc(1) == 0 and a.size_of(0) == K
        assert a.alloc(K + 1) == K
        assert a.try_alloc(1) is None  # the 100-byte tail is unusable
        assert a.free(K) == 2 * K

    def test_hard_capacity(self) -> None:
        a = HostArena(4 * K)
        a.alloc(3 * K)
        assert a.try_alloc(2 * K) is None and not a.can_fit(2 * K) and a.can_fit(K)
        with pytest.raises(CapacityError, match="host arena cannot fit 8192"):
            a.alloc(2 * K)
        assert HostArena(0).try_alloc(1) is None

    def test_bad_input(self) -> None:
        with pytest.raises(ValueError, match="capacity_bytes"):
            HostArena(-1)
        with pytest.raises(ValueError, match="size_bytes"):
            HostArena(K).try_alloc(0)
        with pytest.raises(KeyError, match="offset 5"):
            HostArena(K).free(5)


class ArenaMachine(RuleBasedStateMachine):
    """Random allocs and frees; the arena never overlaps, never exceeds capacity, and
    refuses only when no hole is large enough."""

    @initialize(pages=st.integers(0, 64))
    def setup(self, pages: int) -> None:
        self.cap = pages * K
        self.arena = HostArena(self.cap)
        self.allocs: dict[int, int] = {}

    @rule(size=st.integers(1, 20 * K))
    def alloc(self, size: int) -> None:
        off = self.arena.try_alloc(size)
        need = -(-size // K) * K
        if off is None:
            # Refused: no hole between allocations is large enough.
            edges = sorted(self.allocs.items())
            pos, biggest = 0, 0
            for o, n in edges:
                biggest = max(biggest, o - pos)
                pos = o + n
            biggest = max(biggest, self.cap - pos)
            assert biggest < need
            return
        assert off % K == 0 and off + need <= self.cap
        for o, n in self.allocs.items():
            assert off + need <= o or o + n <= off
        self.allocs[off] = need

    @precondition(lambda self: self.allocs)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        off = data.draw(st.sampled_from(sorted(self.allocs)))
        assert self.arena.free(off) == self.allocs.pop(off)

    @invariant()
    def books(self) -> None:
        self.arena.check_integrity()
        assert self.arena.used_bytes == sum(self.allocs.values()) <= self.cap


TestArenaMachine = ArenaMachine.TestCase
TestArenaMachine.settings = settings(max_examples=50, stateful_step_count=40, deadline=None)


class TestSsdSpace:
    def test_segments_append_in_the_session_file(self) -> None:
        s = SsdSpace(0, 1 << 30, 16 * K)
        e0 = s.allocate("a", 3 * K)
        e1 = s.allocate("a", 2 * K)
        assert e0.new_file and not e1.new_file and e0.file_id == e1.file_id == 0
        assert (e0.file_offset, e1.file_offset) == (K, 4 * K)  # after the 4 KiB file header
        assert e0.base_offset == 0 and e1.offset == 4 * K
        assert s.used_bytes == K + 5 * K

    def test_outgrowing_a_span_opens_a_new_file(self) -> None:
        s = SsdSpace(0, 1 << 30, 8 * K)
        a0 = s.allocate("a", 5 * K)
        b0 = s.allocate("b", K)
        a1 = s.allocate("a", 4 * K)  # 1K + 5K + 4K > 8K
        assert a1.new_file and a1.file_id == 2 and a1.file_offset == K
        assert (a0.base_offset, b0.base_offset, a1.base_offset) == (0, 8 * K, 16 * K)
        assert s.files_of("a") == [0, 2]
        with pytest.raises(CapacityError, match="session_file_bytes"):
            s.allocate("a", 8 * K)  # can never fit next to a file header

    def test_resolve_is_a_range_lookup(self) -> None:
        s = SsdSpace(0, 1 << 30, 8 * K)
        s.allocate("a", K)
        s.allocate("b", K)
        assert s.resolve(8 * K + 123) == (1, 123)
        assert s.resolve(5) == (0, 5)
        with pytest.raises(KeyError, match="not inside"):
            s.resolve(16 * K)

    def test_spans_are_reused_file_ids_are_not(self) -> None:
        s = SsdSpace(0, 1 << 30, 8 * K)
        s.allocate("a", K)
        s.allocate("b", K)
        assert s.release_session("a") == [0]
        c = s.allocate("c", K)
        assert c.base_offset == 0 and c.file_id == 2
        assert s.resolve(K) == (2, K)  # the old address now names the new file
        s.check_integrity()

    def test_budget_is_hard_and_counts_headers(self) -> None:
        s = SsdSpace(0, 6 * K, 64 * K)
        assert s.try_allocate("a", 6 * K) is None  # 6K + 4K header > 6K
        s.allocate("a", 4 * K)  # header + 4K = 5K
        assert s.try_allocate("a", 2 * K) is None
        with pytest.raises(CapacityError, match="ssd_capacity_bytes=24576"):
            s.allocate("a", 2 * K)
        assert s.try_allocate("a", K) is not None and s.used_bytes == 6 * K

    def test_failed_tail_write_rolls_back(self) -> None:
        s = SsdSpace(0, 1 << 30, 64 * K)
        e0 = s.allocate("a", K)
        e1 = s.allocate("a", K)
        assert s.free_extent(e1.file_id, e1.file_offset) == K
        assert s.allocate("a", 2 * K).file_offset == e1.file_offset
        e3 = s.allocate("a", K)
        s.free_extent(e0.file_id, e0.file_offset)  # not the tail: a hole stays
        assert s.allocate("a", K).file_offset == e3.file_offset + K
        s.check_integrity()

    def test_cut_gives_the_tail_back_and_appends_resume_there(self) -> None:
        s = SsdSpace(0, 1 << 30, 64 * K)
        e = [s.allocate("a", n * K) for n in (1, 2, 3, 1)]  # at K, 2K, 4K, 7K
        used = s.used_bytes
        assert s.truncate_file(0, e[2].file_offset) == 4 * K  # extents 2 and 3 go
        assert s.used_bytes == used - 4 * K and s.file(0).end_bytes == 4 * K
        assert s.allocate("a", K).file_offset == e[2].file_offset
        with pytest.raises(ValueError, match="inside the extent"):
            s.truncate_file(0, 3 * K)
        with pytest.raises(ValueError, match="aligned"):
            s.truncate_file(0, 0)
        with pytest.raises(KeyError, match="file_id"):
            s.truncate_file(9, K)
        assert s.truncate_file(0, K) == 4 * K and s.file(0).end_bytes == K
        assert s.used_bytes == K  # the header stays until the file is released
        s.check_integrity()

    def test_adopt_keeps_recorded_base(self) -> None:
        s = SsdSpace(0, 1 << 30, 8 * K)
        e = s.adopt_extent("a", 7, 2 * K, K, base_offset=3 * 8 * K)
        assert e.offset == 3 * 8 * K + 2 * K and s.resolve(e.offset) == (7, 2 * K)
        # Appends go after the adopted segment; new ids are above the adopted one.
        assert s.allocate("a", K).file_offset == 3 * K
        b = s.allocate("b", K)
        assert b.file_id == 8 and b.base_offset == 0  # spans 0..2 were left free
        with pytest.raises(ValueError, match="overlaps"):
            s.adopt_extent("a", 7, 2 * K, K)
        with pytest.raises(ValueError, match="belongs to session"):
            s.adopt_extent("z", 7, 5 * K, K)
        s.check_integrity()

    def test_bad_config(self) -> None:
        with pytest.raises(ValueError, match="session_file_bytes"):
            SsdSpace(0, K, 1000)
        with pytest.raises(ValueError, match="capacity_bytes"):
            SsdSpace(0, -1, 8 * K)


class SsdMachine(RuleBasedStateMachine):
    """Random appends, failed writes, cuts and session drops: the budget is never exceeded,
    files never overlap in the virtual space, every extent resolves to itself."""

    @initialize(cap_pages=st.integers(2, 200), span_pages=st.integers(2, 24))
    def setup(self, cap_pages: int, span_pages: int) -> None:
        self.cap = cap_pages * K
        self.s = SsdSpace(3, self.cap, span_pages * K)
        self.extents: dict[tuple[int, int], tuple[str, int, int]] = {}

    @rule(session=st.sampled_from("abcd"), size=st.integers(1, 12 * K))
    def allocate(self, session: str, size: int) -> None:
        before = self.s.used_bytes
        try:
            e = self.s.try_allocate(session, size)
        except CapacityError:
            assert size > self.s.span_bytes - K  # larger than a span can ever hold
            return
        if e is None:
            # Refused only when the budget cannot take it (plus a header for a new file).
            assert before + -(-size // K) * K + K > self.cap
            return
        assert self.s.file(e.file_id).session_id == session
        self.extents[(e.file_id, e.file_offset)] = (session, e.offset, e.size_bytes)

    @precondition(lambda self: self.extents)
    @rule(data=st.data())
    def fail_write(self, data: st.DataObject) -> None:
        fid, off = data.draw(st.sampled_from(sorted(self.extents)))
        _, _, size = self.extents.pop((fid, off))
        assert self.s.free_extent(fid, off) == size

    @precondition(lambda self: self.extents)
    @rule(data=st.data())
    def cut(self, data: st.DataObject) -> None:
        fid, off = data.draw(st.sampled_from(sorted(self.extents)))
        tail = [k for k in self.extents if k[0] == fid and k[1] >= off]
        freed = sum(self.extents.pop(k)[2] for k in tail)
        assert self.s.truncate_file(fid, off) == freed
        ends = [o + self.extents[(f, o)][2] for f, o in self.extents if f == fid]
        assert self.s.file(fid).end_bytes == max(ends, default=K)

    @rule(session=st.sampled_from("abcd"))
    def drop(self, session: str) -> None:
        ids = self.s.release_session(session)
        for k in [k for k in self.extents if k[0] in ids]:
            del self.extents[k]
        assert self.s.files_of(session) == []

    @invariant()
    def books(self) -> None:
        self.s.check_integrity()
        assert self.s.used_bytes <= self.cap
        for (fid, off), (_, vaddr, size) in self.extents.items():
            assert self.s.resolve(vaddr) == (fid, off)
            assert self.s.resolve(vaddr + size - 1) == (fid, off + size - 1)
        ranges = sorted((v, v + n) for _, v, n in self.extents.values())
        for (_, e0), (s1, _) in itertools.pairwise(ranges):
            assert e0 <= s1


TestSsdMachine = SsdMachine.TestCase
TestSsdMachine.settings = settings(max_examples=50, stateful_step_count=40, deadline=None)


def test_cheapest_window_frees_the_fewest_bytes_in_the_way() -> None:
    arena = HostArena(100, align=1)
    a, b, c, d, e = (arena.alloc(n) for n in (10, 30, 20, 15, 25))  # 0, 10, 40, 60, 75
    arena.free(a)
    arena.free(d)  # free: [0, 10), [60, 75)
    assert arena.cheapest_window(10, {b, c, e}) == []
    # 35 bytes: [40, 75) needs only c (20 bytes); [0, 40) would need b (30).
    assert arena.cheapest_window(35, {b, c, e}) == [c]
    assert arena.cheapest_window(35, {b, e}) == [e]  # [60, 100): 25 bytes, not b's 30
    assert arena.cheapest_window(35, {b}) == [b]  # only [0, 40) is open
    assert arena.cheapest_window(45, {b, e}) is None  # c splits every run
    assert arena.cheapest_window(100, {b, c, e}) == [b, c, e]
    for offset in arena.cheapest_window(35, {b, c, e}) or []:
        arena.free(offset)
    assert arena.can_fit(35)
    arena.check_integrity()


def test_cheapest_window_by_price() -> None:
    arena = HostArena(100, align=1)
    a, b, c, d, e = (arena.alloc(n) for n in (10, 30, 20, 15, 25))  # 0, 10, 40, 60, 75
    arena.free(a)
    arena.free(d)  # free: [0, 10), [60, 75)
    # By bytes [40, 75) (c) is cheapest; priced, b's 30 bytes cost less than c.
    assert arena.cheapest_window(35, {b: 1, c: 5, e: 9}) == [b]
    assert arena.cheapest_window(35, {b: 9, c: 5, e: 1}) == [e]
    assert arena.cheapest_window(35, {b: 0, c: 0, e: 0}) == [b]  # ties: lowest address
    assert arena.cheapest_window(10, {b: 1}) == []
