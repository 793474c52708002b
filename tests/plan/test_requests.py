"""The request protocol (``plan.requests``), scripted on the books alone: the servable
hit and the wait for a store in flight, one FC-MAS weight for a restore with remote
blocks, a load finished by several workers, and damage settled the same way for every
host (cut, or drop with quarantine when the file header is damaged)."""

from __future__ import annotations

from flatcake.control.address import Medium
from flatcake.plan.requests import finish_load, load, restore_request, servable, settle
from flatcake.plan.tasks import LoadDone
from tests.control.helpers import first_turn, make, skeys


def _ssd_turn(cp, session: str, n: int, turn: int,  # type: ignore[no-untyped-def]
              complete: bool = True):
    plan = cp.prepare_store(session, skeys(session, n), turn_index=turn,
                            context_tokens=10**6, prev_reply_tokens=5000)
    assert plan is not None and plan.medium == Medium.SSD
    if complete:
        cp.complete_store(plan, True)
    return plan


def test_a_store_in_flight_past_the_engines_prefix_makes_the_lookup_wait() -> None:
    cp, _ = make()
    first_turn(cp, "s", 3)
    pending = _ssd_turn(cp, "s", 6, 1, complete=False)
    ks = skeys("s", 8)
    # Blocks 3..6 are being written: the hit stops at 3 and the host waits for them ...
    found = servable(cp, ks)
    assert found.hit.num_blocks == 3 and found.wait
    # ... unless the engine already holds them itself.
    assert not servable(cp, ks, engine_blocks=6).wait
    assert servable(cp, ks, engine_blocks=5).wait
    # A second request planning the same blocks writes nothing twice.
    assert cp.prepare_store("s", skeys("s", 6), turn_index=1, context_tokens=10**6,
                            prev_reply_tokens=5000) is None
    cp.complete_store(pending, True)
    found = servable(cp, ks)
    assert found.hit.num_blocks == 6 and not found.wait
    cp.check_integrity()


def test_a_restore_with_remote_blocks_weighs_local_ssd_bytes_plus_remote_blocks() -> None:
    cp, _ = make()
    first_turn(cp, "s", 3)
    ks = skeys("s", 8)
    hit = cp.lookup(ks)
    task, plan = load(cp, "r", hit, list(range(8)))
    local = restore_request(cp, task, plan, 1.0)
    assert local.needs_ssd and local.kv_bytes == plan.read_plan.useful_bytes > 0
    block = cp.geometry.num_layers * cp.geometry.block_bytes_per_layer
    with_far = cp.restore_request("r", 1.0, plan, remote_blocks=5)
    assert with_far.kv_bytes == local.kv_bytes + 5 * block and with_far.needs_ssd
    # Nothing local to read, everything from another node: still the SSD queue.
    only_far = cp.restore_request("x", 1.0, None, remote_blocks=2)
    assert only_far.needs_ssd and only_far.kv_bytes == 2 * block
    cp.complete_load("r")


def test_finish_load_takes_every_workers_report() -> None:
    cp, _ = make()
    p0 = first_turn(cp, "s", 3)
    p1 = _ssd_turn(cp, "s", 6, 1)
    ks = skeys("s", 6)
    load(cp, "r", cp.lookup(ks), list(range(6)))
    seg1 = p1.segment.segment_id
    reports = [LoadDone("r", 6, 6), LoadDone("r", 3, 6, failed_segments=(seg1,))]
    done = finish_load(cp, "r", reports)
    assert done.num_blocks_loaded == 3 and done.newly_damaged == (seg1,)
    assert cp.session("s").num_pins == 0
    # Not served any more; cut at the settle, the first turn kept.
    assert cp.lookup(ks).num_blocks == 3
    (action,) = settle(cp)
    assert action.ssd_segments == (p1.segment,) and not action.quarantine
    assert cp.lookup(ks).num_blocks == 3 and cp.segment(p0.segment.segment_id)
    cp.check_integrity()


def test_a_damaged_file_header_drops_the_session_with_quarantine_once_unpinned() -> None:
    cp, _ = make()
    first_turn(cp, "s", 3)
    p1 = _ssd_turn(cp, "s", 6, 1)
    ks = skeys("s", 6)
    # Another restore reads the first turn while the damage is found.
    load(cp, "other", cp.lookup(skeys("s", 3)), list(range(3)))
    load(cp, "r", cp.lookup(ks), list(range(6)))
    seg1, file1 = p1.segment.segment_id, int(p1.segment.file_id or 0)
    finish_load(cp, "r", [LoadDone("r", 3, 6, failed_segments=(seg1,),
                                   damaged_headers=(file1,))])
    # The cut is ready (nothing reads segment 1 on), but dropping the whole session
    # waits for the restore of its first turn.
    assert settle(cp) == [] and cp.cut_pending("s")
    assert cp.lookup(ks).num_blocks == 3
    cp.complete_load("other")
    (action,) = settle(cp)
    assert action.quarantine and action.session_dropped and file1 in action.file_ids
    assert cp.lookup(ks).num_blocks == 0 and not cp.cut_pending("s")
    cp.check_integrity()
