"""Tenants through the node service: an attached store of one tenant (one key salt) never
lists, reads, loads, writes or drops another tenant's session, by any verb; the owner
still does all of it (issue 40: tenant A's store listed B's sessions and segments, loaded
B's blocks byte-equal and dropped B's session). The tenants survive a restart; a session
whose record was lost is no one's until its tenant's lookup finds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from flatcake.control.index import HitRun, PrefixHit
from flatcake.control.keys import chain_block_keys
from flatcake.service.tenants import RECORD_NAME
from flatcake.store import FlatCakeStore
from tests.service.helpers import Service
from tests.store.helpers import (
    SMALL,
    TO_SSD,
    block_bytes,
    empty_kv,
    random_kv,
    small_config,
)

pytest.importorskip("zmq")
SLOTS = 8


def tenant_keys(salt: str, n: int = 4) -> list[bytes]:
    tokens = list(range(1000, 1000 + n * SMALL.tokens_per_block))
    return chain_block_keys(tokens, SMALL.tokens_per_block, "test-model", salt)


def attached(svc: Service, salt: str) -> FlatCakeStore:
    cfg = small_config(f"store.node=unix:{svc.sock}", "store.node_timeout_s=2")
    return FlatCakeStore.open(svc.root, SMALL, cfg, tenant_salt=salt)


def start(tmp_path: Path) -> Service:
    return Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                   "store.memory_capacity_bytes=4194304",
                   "store.ssd_capacity_bytes=268435456").start()


def assert_loads(store: FlatCakeStore, keys: list[bytes], kv: list) -> None:
    got = empty_kv(SMALL, SLOTS)
    assert store.load(keys, got, list(range(len(keys)))).num_blocks == len(keys)
    for layer in range(SMALL.num_layers):
        for s in range(len(keys)):
            assert block_bytes(got, layer, s, "kv_blocks") == \
                block_bytes(kv, layer, s, "kv_blocks")


def test_a_tenant_cannot_list_load_write_or_drop_another_tenants_session(tmp_path: Path
                                                                         ) -> None:
    svc = start(tmp_path)
    a, b = attached(svc, "team-a"), attached(svc, "team-b")
    try:
        kv = random_kv(SMALL, SLOTS, seed=5)
        keys = tenant_keys("team-a")
        assert a.store_turn("chat", keys, kv, list(range(4)), TO_SSD).num_blocks == 4
        mine = list(a.control.segments())
        assert [s.session_id for s in mine] == ["chat"]

        # B lists nothing of A's.
        assert "chat" not in b.control.session_ids()
        assert list(b.control.segments()) == []
        assert b.inspect()["sessions"] == []
        # B names A's session or segment: refused by every verb.
        for verb, arg in [("session", "chat"), ("newest_turn_index", "chat"),
                          ("files_of", "chat"), ("segment", mine[0].segment_id),
                          ("mark_damaged", mine[0].segment_id)]:
            with pytest.raises(ValueError, match="another tenant's"):
                getattr(b.control, verb)(arg)
        with pytest.raises(ValueError, match="another tenant's"):
            b.drop_session("chat")
        # B's own keys do not hit A's blocks (salted); a hit B makes of A's segment (as
        # if it knew A's keys or listed A's segments) is not loaded.
        assert b.lookup(tenant_keys("team-b")).num_blocks == 0
        forged = PrefixHit(4, 0, 4, (HitRun(mine[0], 0, 4, 0),))
        with pytest.raises(ValueError, match="another tenant's"):
            b.control.prepare_load("b-load", forged)
        with pytest.raises(ValueError, match="another tenant's"):
            b.load(keys, empty_kv(SMALL, SLOTS), list(range(4)))
        # B cannot write into A's session (nor take its name).
        with pytest.raises(ValueError, match="another tenant's"):
            b.store_turn("chat", tenant_keys("team-b"), random_kv(SMALL, SLOTS, seed=6),
                         list(range(4)), TO_SSD)
        st = b.control.stats()
        assert (st.stores_in_flight, st.loads_in_flight) == (0, 0)

        # A still lists, loads (byte for byte) and drops its session.
        assert a.control.session_ids() == ["chat"]
        assert a.inspect()["sessions"][0]["session_id"] == "chat"
        assert_loads(a, keys, kv)
        assert a.drop_session("chat").sessions == ("chat",)
        # The name is free again: B may now use it for its own session.
        kb = tenant_keys("team-b")
        assert b.store_turn("chat", kb, kv, list(range(4)), TO_SSD).num_blocks == 4
        assert a.control.session_ids() == [] and b.control.session_ids() == ["chat"]
    finally:
        a.close()
        b.close()
        assert svc.stop() == 0, svc.stderr()


def test_tenants_survive_a_restart_and_a_lost_record_is_claimed_by_keys(tmp_path: Path
                                                                         ) -> None:
    svc = start(tmp_path)
    kv = random_kv(SMALL, SLOTS, seed=7)
    keys = tenant_keys("team-a")
    a = attached(svc, "team-a")
    try:
        assert a.store_turn("chat", keys, kv, list(range(4)), TO_SSD).num_blocks == 4
    finally:
        a.close()
        assert svc.stop() == 0, svc.stderr()
    for lost in (False, True):
        if lost:  # a crash right after the first write lost its line: no one's
            (svc.root / RECORD_NAME).unlink()
        svc.start()  # the books recovered from the files
        a, b = attached(svc, "team-a"), attached(svc, "team-b")
        try:
            assert b.control.session_ids() == []
            assert a.control.session_ids() == ([] if lost else ["chat"])
            with pytest.raises(ValueError, match="no tenant on record" if lost
                               else "another tenant's"):
                b.drop_session("chat")
            assert b.lookup(tenant_keys("team-b")).num_blocks == 0
            assert a.lookup(keys).num_blocks == 4  # A's keys find it: A's from now on
            assert a.control.session_ids() == ["chat"] and b.control.session_ids() == []
            with pytest.raises(ValueError, match="another tenant's"):
                b.drop_session("chat")
            assert_loads(a, keys, kv)
        finally:
            a.close()
            b.close()
            assert svc.stop() == 0, svc.stderr()
