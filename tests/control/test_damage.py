"""ControlPlane damage books: a segment that failed its checksum stops being served,
its session is cut before its earliest damaged segment once nothing in flight uses the
tail, and every cut or reclaim that removes a damaged segment settles it. Scripted
scenarios, then the control machine with damage and settling rules added."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import rule

from tests.control.helpers import chat_turn, first_turn, make, skeys
from tests.control.machine import ControlMachine


def ssd_turn(cp, session: str, n: int, turn: int):  # type: ignore[no-untyped-def]
    """A long-context turn: SSD, completed at once."""
    plan = cp.prepare_store(session, skeys(session, n), turn_index=turn,
                            context_tokens=10**6, prev_reply_tokens=5000)
    assert plan is not None
    cp.complete_store(plan, True)
    return plan


class TestMarkAndCut:
    def test_damaged_segment_is_not_served_then_cut(self) -> None:
        cp, _ = make()
        p0 = first_turn(cp, "s", 3)
        p1 = ssd_turn(cp, "s", 6, 1)
        ks = skeys("s", 6)
        assert cp.mark_damaged(p1.segment.segment_id)
        assert cp.is_damaged(p1.segment.segment_id) and cp.num_damaged == 1
        assert cp.cut_pending("s") and not cp.cut_pending("other")
        usable = cp.lookup(ks)
        assert usable.num_blocks == 3 and usable.num_ssd_blocks == 3
        assert [r.segment for r in usable.runs] == [p0.segment]
        cut = cp.ready_cuts()
        assert cut == [("s", p1.segment)]
        cp.check_integrity()
        action = cp.truncate_session("s", p1.segment.segment_id)
        assert action.ssd_segments == (p1.segment,)
        assert not cp.cut_pending("s") and cp.num_damaged == 0 and cp.ready_cuts() == []
        assert cp.lookup(ks).num_blocks == 3
        cp.check_integrity()

    def test_earliest_on_disk_wins_whatever_the_order(self) -> None:
        cp, _ = make()
        first_turn(cp, "s", 2)
        p1 = ssd_turn(cp, "s", 4, 1)
        p2 = ssd_turn(cp, "s", 6, 2)
        assert cp.mark_damaged(p2.segment.segment_id)
        assert cp.mark_damaged(p1.segment.segment_id)
        assert cp.mark_damaged(p2.segment.segment_id)
        assert cp.ready_cuts() == [("s", p1.segment)]
        cp.check_integrity()
        cp.truncate_session("s", p1.segment.segment_id)
        assert cp.num_damaged == 0 and not cp.cut_pending("s")

    def test_a_restore_in_flight_holds_the_cut(self) -> None:
        cp, _ = make()
        first_turn(cp, "s", 2)
        p1 = ssd_turn(cp, "s", 4, 1)
        cp.prepare_load("r", skeys("s", 4))
        cp.mark_damaged(p1.segment.segment_id)
        assert cp.ready_cuts() == [] and cp.cut_pending("s")
        cp.complete_load("r")
        assert cp.ready_cuts() == [("s", p1.segment)]

    def test_only_published_ssd_segments(self) -> None:
        cp, _ = make()
        first_turn(cp, "s", 2)
        mem = chat_turn(cp, "s", 4, turn=1)  # memory
        assert not cp.mark_damaged(mem.segment.segment_id)
        assert not cp.mark_damaged(999)
        assert cp.num_damaged == 0 and not cp.cut_pending("s")

    def test_drop_settles_the_damage(self) -> None:
        cp, _ = make()
        p0 = first_turn(cp, "s", 2)
        cp.mark_damaged(p0.segment.segment_id)
        cp.drop_session("s")
        assert cp.num_damaged == 0 and not cp.cut_pending("s") and cp.ready_cuts() == []
        cp.check_integrity()

    def test_a_reclaim_cut_after_the_damage_keeps_it_pending(self) -> None:
        cp, _ = make(memory_pages=2)
        p0 = first_turn(cp, "s", 2)
        mem = chat_turn(cp, "s", 4, turn=1)  # memory-homed, after the SSD turn
        cp.mark_damaged(p0.segment.segment_id)
        cp.session("s").last_access = -1.0
        # Memory reclaim cuts "s" at its first memory segment: the SSD turn stays.
        big = cp.prepare_store("t", skeys("t", 8), turn_index=1, context_tokens=32,
                               prev_reply_tokens=10)
        actions = cp.take_reclaim_actions()
        assert any(mem.segment in a.memory_segments for a in actions)
        assert cp.cut_pending("s") and cp.is_damaged(p0.segment.segment_id)
        if big is not None:
            cp.complete_store(big, True)
        cp.check_integrity()


class TestShadow:
    def test_a_shadow_of_a_damaged_segment_serves_once_settled(self) -> None:
        """Two stores in flight write the same first block (the second started before
        the first was published); the later-started one is published first and owns
        it. Damaged, it is not served; once settled, the other store's copy serves."""
        cp, _ = make(0, 6, 3)
        p0 = cp.prepare_store("s", skeys("s", 1), turn_index=0, context_tokens=4,
                              prev_reply_tokens=None)
        p1 = cp.prepare_store("s", skeys("s", 2), turn_index=1, context_tokens=8,
                              prev_reply_tokens=10)
        assert p0 is not None and p1 is not None and p1.first_block == 0
        cp.complete_store(p1, True)
        assert cp.mark_damaged(p1.segment.segment_id)
        cp.complete_store(p0, True)
        assert cp.lookup(skeys("s", 1)).num_blocks == 0 and cp.cut_pending("s")
        cp.settle_damage()
        hit = cp.lookup(skeys("s", 2))
        assert [r.segment.segment_id for r in hit.runs] == [p0.segment.segment_id]
        assert hit.num_blocks == 1
        cp.check_integrity()

    def test_a_copy_behind_a_damaged_shadow_serves_once_settled(self) -> None:
        """A store in flight with a memory copy; a later turn writes the same block and
        is published first. Damaged, it shadows the copy (neither serves); once
        settled, the copy serves the block."""
        cp, _ = make(2, 9, 9, high=0.8, low=0.4, copy_watermark=1.0)

        def store(n: int, turn: int, big: bool, reply: int | None = None,
                  shared: int = 1):  # type: ignore[no-untyped-def]
            return cp.prepare_store("s", skeys("s", n), turn_index=turn,
                                    context_tokens=10**6 if big else 4 * n,
                                    prev_reply_tokens=reply, shared_refcount=shared)

        for n, turn, big, shared in ((1, 0, True, 1), (2, 1, False, 2), (3, 2, True, 1)):
            plan = store(n, turn, big, shared=shared)
            assert plan is not None
            if turn != 1:  # turn 1 (memory) stays in flight
                cp.complete_store(plan, True)
            else:
                mem = plan
        p = store(4, 3, False)
        assert p is not None and p.copy is not None and p.first_block == 3
        later = store(5, 4, False, reply=10)  # a short-reply turn
        assert later is not None and later.first_block == 3 and later.copy is None
        cp.complete_store(later, True)
        assert cp.mark_damaged(later.segment.segment_id)
        cp.complete_copy(p)
        # Block 3 belongs to the damaged segment: the lookup stops before it.
        assert cp.lookup(skeys("s", 4)).num_blocks == 3 and cp.cut_pending("s")
        cp.complete_store(mem, True)
        cp.settle_damage()
        hit = cp.lookup(skeys("s", 4))
        assert hit.num_blocks == 4 and hit.runs[-1].segment.segment_id in p.copy.segment_ids
        cp.complete_store(p, True)
        cp.check_integrity()


class DamageMachine(ControlMachine):
    """The control machine, with segments failing their checksums and the pending
    cuts applied whenever nothing blocks them."""

    @rule(data=st.data())
    def damage(self, data: st.DataObject) -> None:
        found = [(s, i) for s in self.cp.session_ids()
                 for i in self.cp.session(s).ssd_segment_ids]
        if not found:
            return
        s, seg_id = data.draw(st.sampled_from(found))
        assert self.cp.mark_damaged(seg_id) and self.cp.cut_pending(s)
        hit = self.cp.lookup(skeys(s, self.length[s]))
        assert not any(self.cp.is_damaged(r.segment.segment_id) for r in hit.runs)

    @rule()
    def settle(self) -> None:
        ready = [sid for sid, _seg in self.cp.ready_cuts()]
        self.cp.settle_damage()
        assert not any(self.cp.cut_pending(sid) for sid in ready)


TestDamageMachine = DamageMachine.TestCase
TestDamageMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
