"""Releasing superseded window rows under the node service: the service's books decide,
and each tensor-parallel rank punches its own part's file (split heads: ``ROOT/tp0``,
``ROOT/tp1``), so every part's sliding layer holds the newest window only, and an
engine attached later still restores every block of the newest turn on every rank. An
attached ``FlatCakeStore``'s turns release rows the same way, and the SSD budget counts
what the file holds. The service punches every release itself, in every part's
directory: no engine's workers nor store is handed rows that may be another tenant's."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from flatcake.cio.filescan import scan_session_file
from flatcake.layout import ALIGN, align_up
from flatcake.link.wire import TensorRanks
from flatcake.service.endpoint import ask_status
from flatcake.store import FlatCakeStore, TurnSignals
from tests.connectors.window_turns import GW, PER_TURN, ROW, SLOTS, WINDOW, run_turn
from tests.service.helpers import Service, TensorEngine
from tests.store import window_helpers as embedded
from tests.store.helpers import paged, session_keys, small_config


def test_every_part_is_punched_and_the_newest_turn_restores(tmp_path: Path) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "placement.short_reply_threshold_tokens=0",
                  "store.release_windows_at_once=true").start()
    try:
        e = TensorEngine(svc.sock, TensorRanks(2), g=GW)
        turns = 4
        for t in range(turns):
            run_turn(e, t)
        want = {(rank, layer, b): e.rank_block(rank, layer, SLOTS[b])
                for rank in range(2) for layer in range(3)
                for b in range(turns * PER_TURN)
                if layer < 2 or b >= turns * PER_TURN - WINDOW}
        e.close()
        # Another engine, turn 4: every block of the newest turn, byte for byte per
        # rank. Its store step releases turn 2's rows (its restore read turn 2's full
        # rows until then); turn 3's waits for the next step that calls.
        e2 = TensorEngine(svc.sock, TensorRanks(2), seed=30, g=GW)
        run_turn(e2, turns)
        for (rank, layer, b), raw in want.items():
            assert e2.rank_block(rank, layer, SLOTS[b]) == raw, (rank, layer, b)
        e2.close()
        for part in ("tp0", "tp1"):
            (path,) = sorted((tmp_path / "root" / part / "sessions").iterdir())
            _, segs, damaged = scan_session_file(path)  # the holes, as a restart reads
            assert not damaged
            assert [s.released for s in segs] == [(2,)] * (turns - 1) + [(), ()], part
            full = align_up(segs[0].layout.header_bytes + PER_TURN * 2 * ROW)
            allocated = os.stat(path).st_blocks * 512
            assert allocated <= ALIGN + (turns + 1) * (full + ALIGN) + 2 * WINDOW * ROW, part
    finally:
        assert svc.stop() == 0, svc.stderr()


def test_the_service_punches_what_its_books_release_of_an_attached_stores_turns(
        tmp_path: Path) -> None:
    g = embedded.GEOMETRIES["zero-copy"]
    row, turns, per_turn = g.layer_block_bytes[2], 6, 5
    total = turns * per_turn
    src, keys = paged(g, total, seed=31), session_keys(31, total, g)
    slots = list(range(total))
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "store.memory_capacity_bytes=4194304",
                  "store.ssd_capacity_bytes=268435456",
                  "store.release_windows_at_once=true").start()

    def attached() -> FlatCakeStore:
        cfg = small_config(f"store.node=unix:{svc.sock}", "store.node_timeout_s=2",
                           "store.release_windows_at_once=true")
        return FlatCakeStore.open(svc.root, g, cfg)

    try:
        store = attached()
        for t in range(turns):
            n = (t + 1) * per_turn
            called = int(ask_status(svc.sock, 5.0)["calls"])
            res = store.store_turn("s", keys[:n], src, range(n), TurnSignals(t, 0))
            assert res.medium is not None and res.medium.name == "SSD"
            # Two calls (begin, end: its releases punched there), this status excluded.
            assert int(ask_status(svc.sock, 5.0)["calls"]) - called - 1 == 2
            path = embedded.the_file(svc.root)
            assert embedded.sliding_pages_allocated(store, path) <= embedded.WINDOW * 2 * row
        stats = store.control.stats()
        # The budget counts what the file holds: its header and segments less the
        # released rows.
        segments = sum(align_up(s.layout.total_bytes) for s in store.control.segments())
        assert stats.window_bytes_released > 0
        assert stats.ssd_used_bytes == ALIGN + segments - stats.window_bytes_released
        before = sorted((s.file_offset, s.layout.released)
                        for s in store.control.segments())
        assert [r for _, r in before] == [(2, 3)] * (turns - 1) + [()]
        store.close()
        assert svc.stop() == 0
        svc.start()  # the holes are the record: the same books
        store = attached()
        after = sorted((s.file_offset, s.layout.released)
                       for s in store.control.segments())
        assert after == before
        dst = paged(g, total)
        loaded = store.load(keys, dst, slots)
        assert (loaded.num_blocks, loaded.damaged_segments) == (total, 0)
        embedded.assert_restored(dst, src, slots, total)
        assert torch.equal(dst[0][slots], src[0][:total])
        store.close()
    finally:
        assert svc.stop() == 0, svc.stderr()


def test_the_service_punches_releases_itself_no_store_is_handed_another_tenants() -> None:
    # Tenant A's turns release window rows; tenant B's store calls next. On the old code
    # B was handed A's release to punch (whoever called next was); now the service
    # punches it itself and no store is handed any.
    from flatcake.clock import ManualClock
    from flatcake.control import ControlPlane
    from flatcake.control.keys import tenant_tag
    from flatcake.plan.reads import plan_reads
    from flatcake.service.stores import AttachedStore, attached_call, release_store
    from flatcake.service.tenants import SessionTenants, prefix

    g = embedded.GEOMETRIES["zero-copy"]
    cfg = small_config("store.release_windows_at_once=true",
                       "store.ssd_capacity_bytes=268435456", "placement.memory_copy_watermark=0",
                       "placement.short_reply_threshold_tokens=0")
    cp = ControlPlane(g, cfg, ManualClock(), planner=plan_reads, release_windows=True)
    keys = session_keys(32, 10, g)
    for t, n in enumerate((5, 10)):
        plan = cp.prepare_store(prefix(tenant_tag("a")) + "s", keys[:n], turn_index=t,
                                context_tokens=0)
        assert plan is not None and plan.medium.name == "SSD"
        cp.complete_store(plan, True)
    b = AttachedStore("s2", "b", 2, 0.0, tenant=tenant_tag("b"))
    punched: list = []
    assert attached_call(b, cp, SessionTenants(), 0, "take_window_releases", {},
                         files=lambda drops, cuts, rels: punched.extend(rels)) == []
    assert punched and {r.segment_id for r in punched} <= {s.segment_id
                                                             for s in cp.segments()}
    release_store(b, cp, "detached")
    assert cp.take_window_releases() == []  # punched once, by the service
    assert cp.stats().window_bytes_released == sum(r.bytes for r in punched)
