"""Tenants' engines through the node service: each tenant names its sessions in its
own namespace (``service.tenants``), so the engines of tenants A and B naming the same
session each store and restore their own, byte for byte, and neither appends to the
other's (on the old code B's turn was refused as A's: the name was global); a hit of
A's blocks (A's keys in B's hands) is B's miss; block events name a tenant's own."""

from __future__ import annotations

from pathlib import Path

from flatcake.config import load_config
from flatcake.connectors.scheduler_side import RequestView
from flatcake.control.keys import chain_block_keys, tenant_tag
from flatcake.service.tenants import outside
from flatcake.store import FlatCakeStore
from tests.connectors.sides_harness import G, end
from tests.service.helpers import BASE, Engine, Service
from tests.store.helpers import TO_SSD, random_kv


def salted(rid: str, toks: list[int], salt: str, session: str | None, computed: int = 0
           ) -> RequestView:
    keys = tuple(chain_block_keys(toks, G.tokens_per_block, "tiny", salt))
    return RequestView(rid, keys, len(toks), len(toks), 3, computed, session)


def turn(e: Engine, rid: str, toks: list[int], salt: str, slots: list[int],
         session: str | None = "chat") -> dict:
    """A turn that missed, its prompt computed into ``slots``, finished and stepped."""
    v = salted(rid, toks, salt, session, computed=len(toks))
    assert e.sched.num_matched_tokens(v, 0) == (0, False)
    _, params = end(e, v, slots)
    e.step()
    return params["flatcake"]


def attached(svc: Service, salt: str) -> FlatCakeStore:
    """A ``FlatCakeStore`` of tenant ``salt`` attached to ``svc``."""
    cfg = load_config(env={}, overrides=[*BASE, f"store.node=unix:{svc.sock}",
                                         "store.node_timeout_s=2",
                                         f"store.node_arena_dir={svc.arena_dir}"])
    return FlatCakeStore.open(svc.root, G, cfg, tenant_salt=salt)


def segments(svc: Service, salt: str) -> list[tuple[str, tuple[bytes, ...]]]:
    """(session by the tenant's name, keys) of every segment tenant ``salt``'s attached
    store sees."""
    store = attached(svc, salt)
    try:
        return sorted((str(outside(tenant_tag(salt), s.session_id)), tuple(s.keys))
                      for s in store.control.segments())
    finally:
        store.close()


def restores(e: Engine, rid: str, toks: list[int], salt: str, want: dict) -> None:
    """``toks`` (its first 3 blocks stored) restore ``want`` byte for byte."""
    v = salted(rid, toks, salt, "chat")
    assert e.sched.num_matched_tokens(v, 0) == (12, True)
    e.sched.after_alloc(rid, [30, 31, 32, 33, 34], 12)
    _, _, recving, invalid = e.step()
    assert recving == {rid} and invalid == set()
    for (layer, j), raw in want.items():
        assert e.block(layer, 30 + j) == raw


def test_two_tenants_engines_naming_one_session_are_each_served_their_own(tmp_path: Path
                                                                          ) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock").start()
    a = Engine(svc.sock, seed=1, name="A", tenant_salt="team-a")
    b = Engine(svc.sock, seed=2, name="B", tenant_salt="team-b")
    try:
        toks_a = list(range(100, 113))  # 3 full blocks + 1 token
        got = turn(a, "a0", toks_a, "team-a", [5, 6, 7, 8])
        assert (got["stored_blocks"], got["session_id"]) == (3, "chat")
        want_a = {(layer, j): a.block(layer, s) for layer in range(3)
                  for j, s in enumerate([5, 6, 7])}
        # B's engine names "chat" too: its own session, stored, named back as "chat".
        toks_b = list(range(500, 513))
        got = turn(b, "b0", toks_b, "team-b", [20, 21, 22, 23])
        assert (got["stored_blocks"], got["session_id"]) == (3, "chat")
        want_b = {(layer, j): b.block(layer, s) for layer in range(3)
                  for j, s in enumerate([20, 21, 22])}
        keys_a = salted("x", toks_a, "team-a", "chat").keys[:3]
        keys_b = salted("x", toks_b, "team-b", "chat").keys[:3]
        assert segments(svc, "team-a") == [("chat", keys_a)]
        assert segments(svc, "team-b") == [("chat", keys_b)]
        # B's lookup with A's keys (as if they leaked) is a miss, by any session.
        nxt_a, nxt_b = toks_a + list(range(200, 208)), toks_b + list(range(600, 608))
        for rid, session in [("b1a", "chat"), ("b1b", "other"), ("b1c", None)]:
            v = salted(rid, nxt_a, "team-a", session)
            assert b.sched.num_matched_tokens(v, 0) == (0, False)
        # Each tenant's next turn restores its own bytes exactly.
        restores(a, "a1", nxt_a, "team-a", want_a)
        restores(b, "b1", nxt_b, "team-b", want_b)
        # A session B's engine starts without a name is B's too, named back without
        # its prefix, and B's store lists it by that name.
        got = turn(b, "b2", list(range(900, 913)), "team-b", [40, 41, 42, 43], None)
        assert got["session_id"].startswith("auto-") and got["stored_blocks"] == 3
        assert got["session_id"] in [s for s, _ in segments(svc, "team-b")]
        assert got["session_id"] not in [s for s, _ in segments(svc, "team-a")]
    finally:
        a.close()
        b.close()
        assert svc.stop() == 0, svc.stderr()


def test_an_engine_and_another_tenants_store_naming_one_session(tmp_path: Path) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock").start()
    store = attached(svc, "team-a")
    b = Engine(svc.sock, seed=2, name="B", tenant_salt="team-b")
    try:
        keys = chain_block_keys(list(range(100, 116)), G.tokens_per_block, "tiny",
                                "team-a")
        kv = random_kv(G, 8, seed=5)
        assert store.store_turn("chat", keys, kv, list(range(4)), TO_SSD).num_blocks == 4
        toks_b = list(range(500, 517))
        assert turn(b, "b0", toks_b, "team-b", [20, 21, 22, 23, 24]
                    )["stored_blocks"] == 4
        assert segments(svc, "team-a") == [("chat", tuple(keys))]
        assert segments(svc, "team-b") == [
            ("chat", salted("x", toks_b, "team-b", "chat").keys[:4])]
        assert store.control.session_ids() == ["chat"]
    finally:
        store.close()
        b.close()
        assert svc.stop() == 0, svc.stderr()


def test_an_engines_block_events_leave_out_another_tenants_blocks(tmp_path: Path) -> None:
    # A small SSD: B's turns reclaim A's session, in B's calls.
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "store.ssd_capacity_bytes=65536").start()
    a = Engine(svc.sock, seed=1, name="A", tenant_salt="team-a")
    b = Engine(svc.sock, seed=2, name="B", tenant_salt="team-b")
    try:
        toks_a = list(range(100, 113))
        assert turn(a, "a0", toks_a, "team-a", [5, 6, 7, 8])["stored_blocks"] == 3
        keys_a = set(salted("x", toks_a, "team-a", "chat").keys[:3])
        a.sched.take_events()
        b.sched.take_events()
        keys_b: set[bytes] = set()
        for i in range(12):
            toks = list(range(1000 * (i + 1), 1000 * (i + 1) + 13))
            keys_b |= set(salted("x", toks, "team-b", None).keys[:3])
            turn(b, f"b{i}", toks, "team-b", [20, 21, 22, 23], session=f"b-{i}")
        assert segments(svc, "team-a") == []  # A's session reclaimed
        events = b.sched.take_events()
        assert [e for e in events if e.stored] and [e for e in events if not e.stored]
        assert not [e for e in events if keys_a & set(e.keys)]
        assert set().union(*(e.keys for e in events)) <= keys_b  # B's own only
    finally:
        a.close()
        b.close()
        assert svc.stop() == 0, svc.stderr()


def test_another_tenants_files_are_dropped_by_the_service(tmp_path: Path) -> None:
    # A small SSD: B's turns reclaim A's session, in B's calls. The service deletes
    # A's file itself: B's workers are handed no drop (nor is an attached store of B
    # told of A's session), and the file is gone all the same.
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "store.ssd_capacity_bytes=65536").start()
    a = Engine(svc.sock, seed=1, name="A", tenant_salt="team-a")
    b = Engine(svc.sock, seed=2, name="B", tenant_salt="team-b")
    store = attached(svc, "team-b")
    try:
        assert turn(a, "a0", list(range(100, 113)), "team-a", [5, 6, 7, 8]
                    )["stored_blocks"] == 3
        files_a = set((svc.root / "sessions").iterdir())
        assert len(files_a) == 1
        drops, told = [], []
        apply = store._apply  # what B's store is told the books dropped

        def spy(actions):  # type: ignore[no-untyped-def]
            told.extend(x.session_id for x in actions)
            return apply(actions)

        store._apply = spy  # type: ignore[method-assign]
        for i in range(12):
            toks = list(range(1000 * (i + 1), 1000 * (i + 1) + 13))
            v = salted(f"b{i}", toks, "team-b", f"b-{i}", computed=len(toks))
            assert b.sched.num_matched_tokens(v, 0) == (0, False)
            end(b, v, [20, 21, 22, 23])
            plan, _, _, _ = b.step()
            drops.extend(plan.drops)
            keys = chain_block_keys(toks[:12], G.tokens_per_block, "tiny", "team-b")
            store.store_turn(f"s-{i}", keys, random_kv(G, 3, seed=i), list(range(3)),
                             TO_SSD)
        assert segments(svc, "team-a") == []  # A's session reclaimed
        assert drops == []
        assert "chat" not in told  # B's store was told of its own only
        assert not [f for f in files_a if f.exists()]  # A's file deleted
    finally:
        store.close()
        a.close()
        b.close()
        assert svc.stop() == 0, svc.stderr()
