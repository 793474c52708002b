"""``FlatCakeStore`` attached to the node service (``store.node``): two stores (one per
engine process in a deployment; here two in one process, each with its own executor and
its own mapping of the shared arena) share one root's books: a turn stored by one is
restored by the other byte for byte, from SSD and from the shared arena; a store cannot
open the served root embedded; the service gone, a store call fails with a clear
``ConnectionError``, never hangs."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from flatcake.service.endpoint import ask_status
from flatcake.store import FlatCakeStore, TurnSignals
from tests.service.helpers import Service
from tests.store.helpers import (
    SMALL,
    TO_MEMORY,
    TO_SSD,
    block_bytes,
    empty_kv,
    random_kv,
    session_keys,
    small_config,
)

SLOTS = 16


def attached(svc: Service) -> FlatCakeStore:
    cfg = small_config(f"store.node=unix:{svc.sock}", "store.node_timeout_s=2")
    return FlatCakeStore.open(svc.root, SMALL, cfg)


def test_two_stores_share_one_root_through_the_service(tmp_path: Path) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "store.memory_capacity_bytes=4194304",
                  "store.ssd_capacity_bytes=268435456").start()
    a, b = attached(svc), attached(svc)
    try:
        kv = random_kv(SMALL, SLOTS, seed=7)
        keys = session_keys(1, 7)
        slots = list(range(7))
        ra = a.store_turn("s1", keys[:4], kv, slots, TO_SSD)
        rb = a.store_turn("s1", keys, kv, slots, TO_MEMORY)
        assert ra.num_blocks == 4 and rb.num_blocks == 3
        assert b.lookup(keys).num_blocks == 7
        got = empty_kv(SMALL, SLOTS)
        res = b.load(keys, got, slots)
        assert (res.num_blocks, res.num_ssd_blocks, res.num_memory_blocks) == (7, 4, 3)
        for layer in range(SMALL.num_layers):
            for s in slots:
                assert block_bytes(got, layer, s, "kv_blocks") == \
                    block_bytes(kv, layer, s, "kv_blocks")
        # B extends the session: one file for the session, whoever writes.
        more = session_keys(1, 9)
        kv2 = random_kv(SMALL, SLOTS, seed=8)
        assert b.store_turn("s1", more, kv2, list(range(9)), TO_SSD).num_blocks == 2
        assert len(list((svc.root / "sessions").iterdir())) == 1
        got2 = empty_kv(SMALL, SLOTS)
        assert a.load(more, got2, list(range(9))).num_blocks == 9
        assert block_bytes(got2, 2, 8, "kv_blocks") == block_bytes(kv2, 2, 8, "kv_blocks")
        with pytest.raises(ValueError, match="already open"):
            FlatCakeStore.open(svc.root, SMALL, small_config())
        svc.kill()
        with pytest.raises(ConnectionError, match="no node service listens"):
            b.lookup(keys)
    finally:
        a.close()
        b.close()
        svc.stop()


def test_a_session_alternating_between_two_stores_stays_in_one_file(tmp_path: Path) -> None:
    """Turns 0..5 of one session written alternately by two attached stores (two engines),
    all on SSD: one session file, and a cold restore of the whole session (every turn's
    blocks, after the others were written) reads them in at most layers x turns commands,
    byte for byte."""
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "store.memory_capacity_bytes=4194304",
                  "store.ssd_capacity_bytes=268435456").start()
    a, b = attached(svc), attached(svc)
    turns, per_turn = 6, 2
    keys = session_keys(3, turns * per_turn)
    kv = random_kv(SMALL, SLOTS, seed=11)
    slots = list(range(turns * per_turn))
    try:
        for t in range(turns):
            end = (t + 1) * per_turn
            res = (a, b)[t % 2].store_turn(
                "s3", keys[:end], kv, slots[:end],
                TurnSignals(turn_index=t, context_tokens=end * SMALL.tokens_per_block,
                            prev_reply_tokens=4096))
            assert (res.num_blocks, res.first_block) == (per_turn, t * per_turn)
            assert res.medium is not None and res.medium.name == "SSD", res
        files = list((svc.root / "sessions").iterdir())
        assert len(files) == 1, files
        for store in (a, b):
            got = empty_kv(SMALL, SLOTS)
            loaded = store.load(keys, got, slots)
            assert (loaded.num_blocks, loaded.num_ssd_blocks) == (len(keys), len(keys))
            assert 0 < loaded.commands <= SMALL.num_layers * turns, loaded
            for layer in range(SMALL.num_layers):
                for s in slots:
                    assert block_bytes(got, layer, s, "kv_blocks") == \
                        block_bytes(kv, layer, s, "kv_blocks")
    finally:
        a.close()
        b.close()
        svc.stop()


def test_an_attached_store_turn_is_two_calls(tmp_path: Path) -> None:
    """Begin (settle, prepare, reclaim: ``plan.requests.begin_store``) and end (the
    memory copy told, complete, window rows released: ``end_store``), whichever medium
    the turn goes to, with a memory copy or not, and when its write fails; the turns
    written are then served, from their copy where they have one."""
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "store.memory_capacity_bytes=4194304",
                  "store.ssd_capacity_bytes=268435456",
                  "placement.memory_copy_watermark=0.9").start()
    a = attached(svc)

    def calls() -> int:
        return int(ask_status(svc.sock, 5.0)["calls"])

    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    try:
        kv = random_kv(SMALL, SLOTS, seed=5)
        keys = session_keys(3, 9)
        for n, signals in ((3, TO_SSD), (6, TO_MEMORY), (9, TO_SSD)):
            before = calls()
            res = a.store_turn("s", keys[:n], kv, list(range(n)), signals)
            assert (res.num_blocks, res.error) == (3, "")
            assert calls() - before - 1 == 2  # the calls since, this status call excluded
        assert a.control.stats().num_memory_copies == 2  # both SSD turns have a copy
        got = empty_kv(SMALL, SLOTS)
        loaded = a.load(keys, got, list(range(9)))
        assert (loaded.num_blocks, loaded.num_memory_blocks, loaded.bytes_read) == (9, 9, 0)
        assert all(block_bytes(got, layer, s, "kv_blocks") == block_bytes(kv, layer, s,
                                                                          "kv_blocks")
                   for layer in range(SMALL.num_layers) for s in range(9))
        # An SSD write that fails after its copy: the same two calls; its new file is
        # given back (deleted), its blocks are homed in the copy, nothing on SSD.
        other = session_keys(4, 3)
        a._exec.writer.write_ssd = no_space  # type: ignore[method-assign,assignment]
        before = calls()
        res = a.store_turn("t", other, kv, list(range(3)), TO_SSD)
        assert res.num_blocks == 0 and "No space" in res.error
        assert calls() - before - 1 == 2
        hit = a.lookup(other)
        assert (hit.num_blocks, hit.num_memory_blocks, hit.num_ssd_blocks) == (3, 3, 0)
        assert a.control.stats().stores_in_flight == 0
        assert len(list((svc.root / "sessions").iterdir())) == 1
    finally:
        a.close()
        assert svc.stop() == 0, svc.stderr()
