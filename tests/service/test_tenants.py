"""Tenants through the node service: an attached store of one tenant (one key salt) never
lists, reads, loads, writes or drops another tenant's session, by any verb; the owner
still does all of it (issue 40: tenant A's store listed B's sessions and segments, loaded
B's blocks byte-equal and dropped B's session). The tenants survive a restart; a session
whose record was lost is no one's until its tenant's lookup finds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from flatcake.control.index import HitRun, PrefixHit
from flatcake.control.keys import chain_block_keys, tenant_tag
from flatcake.service.tenants import RECORD_NAME, prefix
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


def test_two_tenants_naming_one_session_are_each_served_their_own(tmp_path: Path
                                                                    ) -> None:
    """Each tenant names its sessions in its own namespace: A, B and the tenant without
    a salt all store "chat", each lists, loads (byte for byte) and drops its own, and
    none lists, reads, loads or drops another's (on the old code B's "chat" was refused
    as A's: B learnt that A had one)."""
    svc = start(tmp_path)
    a, b, c = attached(svc, "team-a"), attached(svc, "team-b"), attached(svc, "")
    try:
        kvs = {s: random_kv(SMALL, SLOTS, seed=n) for n, s in enumerate(("a", "b", "c"))}
        keys = {"a": tenant_keys("team-a"), "b": tenant_keys("team-b"),
                "c": tenant_keys("")}
        stores = {"a": a, "b": b, "c": c}
        for t, store in stores.items():
            assert store.store_turn("chat", keys[t], kvs[t], list(range(4)),
                                    TO_SSD).num_blocks == 4
        for t, store in stores.items():
            assert store.control.session_ids() == ["chat"]
            assert [x["session_id"] for x in store.inspect()["sessions"]] == ["chat"]
            assert store.control.session("chat").session_id == "chat"
            assert_loads(store, keys[t], kvs[t])
        # Segments carry the books' name: the tenant's prefix, then its own name.
        books = {t: [s.session_id for s in store.control.segments()]
                 for t, store in stores.items()}
        assert books["a"] == [prefix(tenant_tag("team-a")) + "chat"]
        assert books["b"] == [prefix(tenant_tag("team-b")) + "chat"] and books["c"] == ["chat"]
        a_seg = next(iter(a.control.segments()))

        # B names A's session by its books' name, or A's segment: refused by every verb.
        for verb, arg in [("session", books["a"][0]), ("newest_turn_index", books["a"][0]),
                          ("files_of", books["a"][0]), ("drop_session", books["a"][0]),
                          ("segment", a_seg.segment_id),
                          ("mark_damaged", a_seg.segment_id)]:
            with pytest.raises(ValueError, match="another tenant's"):
                getattr(b.control, verb)(arg)
        with pytest.raises(ValueError, match="another tenant's"):  # nor C A's, A C's
            c.control.session(books["a"][0])
        with pytest.raises(ValueError, match="another tenant's"):
            a.control.drop_session(books["b"][0])
        # A hit B makes of A's segment (as if it knew A's keys) is not loaded.
        forged = PrefixHit(4, 0, 4, (HitRun(a_seg, 0, 4, 0),))
        with pytest.raises(ValueError, match="another tenant's"):
            b.control.prepare_load("b-load", forged)
        with pytest.raises(ValueError, match="another tenant's"):
            b.load(keys["a"], empty_kv(SMALL, SLOTS), list(range(4)))
        st = b.control.stats()
        assert (st.stores_in_flight, st.loads_in_flight) == (0, 0)

        # B drops its "chat": A's and C's are untouched, still byte for byte.
        assert b.drop_session("chat").sessions == ("chat",)
        assert b.control.session_ids() == [] and b.lookup(keys["b"]).num_blocks == 0
        for t in ("a", "c"):
            assert stores[t].control.session_ids() == ["chat"]
            assert_loads(stores[t], keys[t], kvs[t])
        # A names its own session by its books' name too.
        assert a.control.session(books["a"][0]).session_id == "chat"
        assert a.drop_session("chat").sessions == ("chat",)
        assert c.control.session_ids() == ["chat"]
        assert_loads(c, keys["c"], kvs["c"])
    finally:
        for store in (a, b, c):
            store.close()
        assert svc.stop() == 0, svc.stderr()


def test_a_session_id_that_is_not_one_is_refused_by_name(tmp_path: Path) -> None:
    """The prefix counts in the id's bytes; the tenant without a salt cannot name a
    tenant's namespace."""
    svc = start(tmp_path)
    a, c = attached(svc, "team-a"), attached(svc, "")
    try:
        kv = random_kv(SMALL, SLOTS, seed=3)
        with pytest.raises(ValueError, match="tenant's prefix"):
            a.store_turn("x" * 2040, tenant_keys("team-a"), kv, list(range(4)), TO_SSD)
        with pytest.raises(ValueError, match="another tenant's namespace"):
            c.store_turn("\x1fchat", tenant_keys(""), kv, list(range(4)), TO_SSD)
        assert a.control.session_ids() == [] and c.control.session_ids() == []
    finally:
        a.close()
        c.close()
        assert svc.stop() == 0, svc.stderr()


def test_tenants_survive_a_restart_and_a_lost_record_is_claimed_by_keys(tmp_path: Path
                                                                         ) -> None:
    """A tenant's sessions are its by their names, record or not; a plain one (the
    tenant without a salt) whose record was lost is no one's until its keys hit it."""
    svc = start(tmp_path)
    kvs = {t: random_kv(SMALL, SLOTS, seed=7 + n) for n, t in enumerate(("team-a", ""))}
    keys = {t: tenant_keys(t) for t in kvs}
    for t in kvs:
        store = attached(svc, t)
        try:
            assert store.store_turn("chat", keys[t], kvs[t], list(range(4)),
                                    TO_SSD).num_blocks == 4
        finally:
            store.close()
    assert svc.stop() == 0, svc.stderr()
    for lost in (False, True):
        if lost:  # a crash right after the first write lost its line
            (svc.root / RECORD_NAME).unlink()
        svc.start()  # the books recovered from the files
        a, b, c = attached(svc, "team-a"), attached(svc, "team-b"), attached(svc, "")
        try:
            assert b.control.session_ids() == []
            assert a.control.session_ids() == ["chat"]  # its prefix names its tenant
            assert c.control.session_ids() == ([] if lost else ["chat"])
            if lost:
                with pytest.raises(ValueError, match="no tenant on record"):
                    c.drop_session("chat")
            assert b.lookup(tenant_keys("team-b")).num_blocks == 0
            assert c.lookup(keys[""]).num_blocks == 4  # its keys find it: its from now on
            assert c.control.session_ids() == ["chat"] and b.control.session_ids() == []
            forged = PrefixHit(4, 0, 4, tuple(HitRun(s, 0, 4, 0)
                                              for s in c.control.segments()))
            with pytest.raises(ValueError, match="another tenant's"):
                b.control.prepare_load("b-load", forged)
            for t, store in (("team-a", a), ("", c)):
                assert_loads(store, keys[t], kvs[t])
        finally:
            for store in (a, b, c):
                store.close()
            assert svc.stop() == 0, svc.stderr()


def test_the_record_takes_a_ticks_sessions_in_one_write(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """Each session first written is a line of the record, appended with the service's
    next tick (all of that tick's in one write) or at close; a restart reads them."""
    from flatcake.clock import WallClock
    from flatcake.control import ControlPlane
    from flatcake.service import tenants as module

    writes: list[bytes] = []
    write = module.os.write

    def counted(fd: int, data: bytes) -> int:
        writes.append(bytes(data))
        return write(fd, data)

    control = ControlPlane(SMALL, small_config(), WallClock())
    record = module.SessionTenants(tmp_path)
    monkeypatch.setattr(module.os, "write", counted)
    for n in range(5):
        record.claim(control, b"", f"chat-{n}")
    assert writes == []  # not one write a session
    record.sweep(control)  # the tick (the books hold none of them: forgotten there)
    assert len(writes) == 1 and writes[0].count(b"\n") == 5
    record.claim(control, b"", "late")
    record.close()
    assert len(writes) == 2 and b"late" in writes[1]
    lines = (tmp_path / RECORD_NAME).read_text().splitlines()
    assert lines == [f'["", "chat-{n}"]' for n in range(5)] + ['["", "late"]']
