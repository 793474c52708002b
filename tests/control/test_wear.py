"""SSD wear in the books (``control.wear``): exact bytes written, read back, dropped
unread and unread, counted where segments are published, restored and reclaimed."""

from __future__ import annotations

from flatcake.control.wear import WearCounts, wear_increments
from tests.control.helpers import first_turn, make, skeys


def test_written_read_back_and_dropped_unread_are_exact() -> None:
    cp, _ = make()  # no memory copies: a restore reads the SSD
    a = first_turn(cp, "a", 3)
    b = first_turn(cp, "b", 2)
    wa, wb = a.segment.total_bytes, b.segment.total_bytes
    assert cp.ssd_wear() == WearCounts(wa + wb, 0, 0, wa + wb)
    lp = cp.prepare_load("r", skeys("a", 3))
    assert lp.read_plan.bytes_read > 0
    assert cp.ssd_wear().read_bytes == 0  # counted once the restore ends
    cp.complete_load("r")
    assert cp.ssd_wear() == WearCounts(wa + wb, lp.read_plan.bytes_read, 0, wb)
    cp.drop_session("b")  # never read: wear for nothing
    assert cp.ssd_wear() == WearCounts(wa + wb, lp.read_plan.bytes_read, wb, 0)
    cp.drop_session("a")  # read back once: not counted as unread
    assert cp.ssd_wear() == WearCounts(wa + wb, lp.read_plan.bytes_read, wb, 0)
    st = cp.stats()
    assert (st.ssd_written_bytes, st.ssd_read_bytes, st.ssd_dropped_unread_bytes,
            st.ssd_unread_bytes) == (wa + wb, lp.read_plan.bytes_read, wb, 0)


def test_a_restore_served_by_the_memory_copy_reads_no_ssd() -> None:
    cp, _ = make(memory_pages=8, copy_watermark=0.5)
    a = first_turn(cp, "a", 3)
    assert a.copy is not None
    cp.prepare_load("r", skeys("a", 3))
    cp.complete_load("r")
    w = a.segment.total_bytes
    assert cp.ssd_wear() == WearCounts(w, 0, 0, w)


def test_a_failed_or_memory_store_writes_no_ssd() -> None:
    cp, _ = make()
    plan = cp.prepare_store("a", skeys("a", 2), turn_index=0, context_tokens=8)
    assert plan is not None
    cp.complete_store(plan, False)
    mem = cp.prepare_store("m", skeys("m", 2), turn_index=3, context_tokens=8,
                           prev_reply_tokens=10)  # short reply: memory
    assert mem is not None and mem.medium.name == "MEMORY"
    cp.complete_store(mem, True)
    assert cp.ssd_wear() == WearCounts(0, 0, 0, 0)


def test_increments_are_the_growth_of_the_three_counters() -> None:
    assert wear_increments(WearCounts(10, 4, 1, 5), WearCounts(30, 4, 3, 9)) == {
        "ssd_written_bytes": 20, "ssd_read_bytes": 0, "ssd_dropped_unread_bytes": 2}
