"""The control plane's stateful test: ``ControlMachine`` drives a small ``ControlPlane``
through random stores, restores, reclaims, drops, cuts and clock steps and checks its
books after every step. ``test_plane`` runs it as it is; ``test_damage`` adds damage and
settling rules on top."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from flatcake.control import LoadPlan, ReclaimAction, StorePlan
from flatcake.control.address import Medium
from flatcake.errors import CapacityError
from tests.control.helpers import GEOM, make, skeys


class ControlMachine(RuleBasedStateMachine):
    """Random stores (ok or failed), restores, reclaims, drops, cuts at a damaged
    segment and clock steps on small budgets, with and without memory copies: a pinned
    session is never reclaimed, a segment a restore reads or a write in flight after it
    is never cut, budgets hold, integrity after every step, a block is visible only
    once its store completed, memory reclaim drops memory-homed segments only (never an
    SSD segment or a file), and the only holes are there: every indexed block of a
    session is reachable by the session's own keys, or its prefix runs through a block
    memory reclaim dropped."""

    SESSIONS = ("s0", "s1", "s2", "s3", "s4")

    @initialize(mem_pages=st.integers(0, 8), ssd_pages=st.integers(4, 60),
                span_pages=st.integers(3, 16), copies=st.sampled_from([0.0, 0.5, 1.0]))
    def setup(self, mem_pages: int, ssd_pages: int, span_pages: int, copies: float) -> None:
        self.cp, self.clock = make(mem_pages, ssd_pages, span_pages, high=0.8, low=0.4,
                                   copy_watermark=copies)
        self.copy_watermark = copies
        self.length = dict.fromkeys(self.SESSIONS, 0)
        self.turn = dict.fromkeys(self.SESSIONS, 0)
        self.pending: list[StorePlan] = []
        self.loads: dict[str, frozenset[str]] = {}
        self.plans: dict[str, LoadPlan] = {}
        self.next_rid = 0
        self.memory_dropped: set[bytes] = set()  # keys of memory homes memory reclaim dropped

    def pinned(self) -> set[str]:
        """Sessions pinned now (and the copies held now, for ``check_actions``)."""
        self.copies_before = {i for c in self.cp.memory_copies() for i in c.segment_ids}
        out = {p.session_id for p in self.pending}
        for sessions in self.loads.values():
            out |= sessions
        return out

    def check_actions(self, pinned: set[str],
                      actions: list[ReclaimAction] | None = None) -> None:
        """No pinned session is reclaimed; a memory copy may go (it cuts nothing), but
        never one a restore in flight reads."""
        read = {run.segment.segment_id for lp in self.plans.values() for run in lp.hit.runs}
        for a in self.cp.take_reclaim_actions() if actions is None else actions:
            dropped = {x.segment_id for x in a.memory_segments}
            assert not dropped & read, f"dropped memory {dropped & read} a restore reads"
            copies_only = not a.ssd_segments and not a.file_ids and not a.session_dropped \
                and dropped <= self.copies_before
            assert copies_only or a.session_id not in pinned, \
                f"reclaimed pinned session {a.session_id}"
            if a.medium is Medium.MEMORY:
                assert (a.ssd_segments, a.file_ids, a.cut_files) == ((), (), ()), \
                    f"memory reclaim of {a.session_id} dropped SSD segments or files"
                self.memory_dropped.update(k for x in a.memory_segments
                                           if x.segment_id not in self.copies_before
                                           for k in x.keys)

    @rule(s=st.sampled_from(SESSIONS), new=st.integers(1, 12),
          reply=st.sampled_from([None, 10, 1000, 5000]), shared=st.sampled_from([1, 1, 2]),
          big_context=st.booleans())
    def store(self, s: str, new: int, reply: int | None, shared: int,
              big_context: bool) -> None:
        n = self.length[s] + new
        pinned = self.pinned() | {s}
        try:
            plan = self.cp.prepare_store(
                s, skeys(s, n), turn_index=self.turn[s],
                context_tokens=10**6 if big_context else 4 * n,
                prev_reply_tokens=reply if self.turn[s] else None, shared_refcount=shared)
        except CapacityError:
            self.check_actions(pinned)
            return
        self.check_actions(pinned)
        self.length[s], self.turn[s] = n, self.turn[s] + 1
        if plan is None:
            return
        # Allocated, not yet visible (an earlier turn's copy written ahead may be).
        mine = {plan.segment.segment_id} | set(plan.copy.segment_ids if plan.copy else ())
        assert not {r.segment.segment_id for r in self.cp.lookup(skeys(s, n)).runs} & mine
        if plan.copy is not None:  # only under the copy watermark, never for memory
            assert plan.medium == Medium.SSD
            assert self.cp.memory_used_bytes <= self.copy_watermark * \
                self.cp.memory_capacity_bytes
        self.pending.append(plan)

    @rule(s=st.sampled_from(SESSIONS), new=st.integers(1, 6))
    def ssd_turn(self, s: str, new: int) -> None:
        """A long-context turn, written and completed at once (SSD history to cut)."""
        plan = self.turn_now(s, new, big_context=True)
        assert plan is None or plan.medium == Medium.SSD

    @rule(s=st.sampled_from(SESSIONS), new=st.integers(1, 6))
    def chat_turn(self, s: str, new: int) -> None:
        """A short-reply turn (memory unless full), written and completed at once."""
        if not self.turn[s]:
            return
        self.turn_now(s, new, big_context=False)

    def turn_now(self, s: str, new: int, big_context: bool) -> StorePlan | None:
        """Store ``new`` blocks of ``s`` (SSD by agent context, or a short-reply turn)
        and complete the write at once."""
        n = self.length[s] + new
        pinned = self.pinned() | {s}
        try:
            plan = self.cp.prepare_store(
                s, skeys(s, n), turn_index=self.turn[s],
                context_tokens=10**6 if big_context else 4 * n,
                prev_reply_tokens=None if big_context else 10)
        except CapacityError:
            self.check_actions(pinned)
            return None
        self.check_actions(pinned)
        self.length[s], self.turn[s] = n, self.turn[s] + 1
        if plan is not None:
            self.cp.complete_store(plan, True)
        return plan

    @precondition(lambda self: any(p.copy is not None for p in self.pending))
    @rule(data=st.data())
    def copy_written(self, data: st.DataObject) -> None:
        """A memory copy lands before its segment: it is readable at once."""
        plan = data.draw(st.sampled_from([p for p in self.pending if p.copy is not None]))
        self.cp.complete_copy(plan)
        hit = self.cp.lookup(skeys(plan.session_id, plan.first_block + plan.segment.num_blocks))
        # Served whole, unless an earlier part is missing meanwhile, or a damaged
        # segment that owns one of these keys first shadows the copy until it is settled.
        assert hit.num_blocks >= plan.first_block + plan.segment.num_blocks or \
            hit.num_blocks < plan.first_block or self.cp.cut_pending(plan.session_id)

    @precondition(lambda self: self.pending)
    @rule(data=st.data(), ok=st.booleans())
    def complete(self, data: st.DataObject, ok: bool) -> None:
        plan = data.draw(st.sampled_from(self.pending))
        self.pending.remove(plan)
        self.cp.complete_store(plan, ok)
        if ok:
            hit = self.cp.lookup(plan.segment.keys)
            # All served, unless a damaged segment of the session (its cut pending)
            # owns one of these keys first: this segment shadows it until it is settled.
            assert hit.num_blocks == plan.segment.num_blocks or \
                self.cp.cut_pending(plan.session_id)

    @rule(s=st.sampled_from(SESSIONS))
    def load(self, s: str) -> None:
        rid = f"r{self.next_rid}"
        self.next_rid += 1
        lp = self.cp.prepare_load(rid, skeys(s, self.length[s]))
        assert lp.read_plan.num_commands <= GEOM.num_layers * len(lp.hit.runs)
        # A held memory copy is read in place of its SSD home.
        for run in lp.hit.runs:
            assert run.segment.medium == Medium.MEMORY or \
                self.cp.memory_copy(run.segment.segment_id) is None
        self.loads[rid] = lp.session_ids
        self.plans[rid] = lp

    @precondition(lambda self: self.loads)
    @rule(data=st.data())
    def finish_load(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.loads)))
        del self.loads[rid]
        del self.plans[rid]
        self.cp.complete_load(rid)

    @rule()
    def reclaim(self) -> None:
        pinned = self.pinned()
        self.check_actions(pinned, self.cp.reclaim())

    @rule(s=st.sampled_from(SESSIONS))
    def drop(self, s: str) -> None:
        if s in self.pinned() or s not in self.cp.session_ids():
            return
        self.cp.drop_session(s)

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        """A segment fails its checksum: cut its session there (or learn it must wait)."""
        found = [(s, i) for s in self.cp.session_ids()
                 for i in self.cp.session(s).ssd_segment_ids]
        if not found:
            return
        s, seg_id = data.draw(st.sampled_from(found))
        seg = self.cp.segment(seg_id)
        cut = (seg.file_id, seg.file_offset)
        tail = {i for i in self.cp.session(s).ssd_segment_ids
                if (self.cp.segment(i).file_id,
                    self.cp.segment(i).file_offset) >= cut}  # type: ignore[operator]
        assert tail == {i for i in self.cp.session(s).ssd_segment_ids if i >= seg_id}
        later = tail | {i for i in self.cp.session(s).memory_segment_ids if i > seg_id}
        busy = any(p.session_id == s and p.segment.segment_id > seg_id
                   for p in self.pending) or any(
            self.cp.home_segment_id(run.segment) in later for lp in self.plans.values()
            for run in lp.hit.runs)
        assert self.cp.tail_in_use(s, seg_id) == busy
        if busy:
            with pytest.raises(ValueError, match="in flight"):
                self.cp.truncate_session(s, seg_id)
            return
        kept = [i for i in self.cp.session(s).ssd_segment_ids if i not in tail]
        copies = {i for c in self.cp.memory_copies() for i in c.segment_ids}
        action = self.cp.truncate_session(s, seg_id)
        assert {x.segment_id for x in action.ssd_segments} == tail
        assert {x.segment_id for x in action.memory_segments} - copies == later - tail
        for i in tail:
            with pytest.raises(KeyError):
                self.cp.segment(i)
        if not action.session_dropped:
            assert self.cp.session(s).ssd_segment_ids == kept

    @rule(dt=st.floats(0, 10))
    def tick(self, dt: float) -> None:
        self.clock.advance(dt)

    @invariant()
    def books(self) -> None:
        self.cp.check_integrity()
        st_ = self.cp.stats()
        assert st_.memory_used_bytes <= st_.memory_capacity_bytes
        assert st_.ssd_used_bytes <= st_.ssd_capacity_bytes
        for s in self.pinned():
            assert s in self.cp.session_ids()

    @invariant()
    def no_holes(self) -> None:
        """Each live segment's blocks are found by a lookup of its session's keys up to
        its last block, or the lookup stops at a block memory reclaim dropped: nothing
        else before it was dropped from under it."""
        for s in self.cp.session_ids():
            chain = skeys(s, self.length[s])
            where = {k: i for i, k in enumerate(chain)}
            ends = {where[seg.keys[-1]] + 1 for seg in self.cp.segments()
                    if seg.session_id == s}
            for end in ends:
                # The index itself (``lookup`` stops before a damaged segment that
                # waits for its cut; reachability is the index's).
                n = self.cp.index.lookup(chain[:end]).num_blocks
                assert n == end or chain[n] in self.memory_dropped, f"hole in {s} at {n}"
