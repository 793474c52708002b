"""One peer's malformed messages never stop the node service: a DEALER's two-frame
``send_multipart`` (it killed the service: "too many values to unpack"), empty, random,
truncated and wrongly shaped frames, of any frame count, are answered with an error or
dropped, and a real engine attached afterwards is served; a store's held ``servable``
whose wait has no end is refused."""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any

import pytest

from flatcake.link import wire
from flatcake.service.endpoint import ask_status
from flatcake.store import FlatCakeStore
from tests.connectors.sides_harness import finish
from tests.service.helpers import Engine, Service
from tests.store.helpers import SMALL, TO_SSD, random_kv, session_keys, small_config

zmq = pytest.importorskip("zmq")

CALL = pickle.dumps((0, "", wire.STATUS, ()))


def malformed() -> list[list[bytes]]:
    rng = random.Random(40)
    shaped = [(1, 2), (1, "", wire.ATTACH, "not a tuple"), ("id", "", wire.STATUS, ()),
              (1, "", [wire.STATUS], ()), (1, {}, wire.CONTROL, ()), (1, "", 7, ()),
              (1, "", wire.ATTACH, ()), (1, "", wire.WORKER, (0, None, None)),
              (1, "e0", "step", ()), (1, "", wire.CONTROL, (None,)), None, "x" * 1000]
    messages = [[b"a", b"b"],  # a DEALER's send_multipart: killed the service
                [CALL, CALL], [b"", b"", b""], [b""], [CALL[:7]], [b"\x80\x05garbage"],
                *[[pickle.dumps(s)] for s in shaped]]
    for _ in range(40):  # random bytes, 1 to 5 frames
        messages.append([rng.randbytes(rng.randrange(0, 300))
                         for _ in range(rng.randrange(1, 6))])
    return messages


def test_malformed_messages_are_answered_and_the_service_keeps_serving(tmp_path: Path
                                                                       ) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock").start()
    ctx = zmq.Context()
    peer = ctx.socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.connect(wire.endpoint(svc.sock))
    try:
        messages = malformed()
        for frames in messages:
            peer.send_multipart(frames)
        replies = []
        while peer.poll(5000):
            replies.append(pickle.loads(peer.recv()))
            if len(replies) == len(messages):
                break
        assert svc.proc is not None and svc.proc.poll() is None, svc.stderr()
        # Every one answered as an error; the two-frame one says why.
        assert len(replies) == len(messages)
        assert all(ok is False for _, ok, _ in replies)
        assert "malformed call: 2 frames, a call is one" in replies[0][2]
        # A real engine attaches, stores a turn and finds it.
        e = Engine(svc.sock, seed=1)
        try:
            p = finish(e, "r0", list(range(100, 113)), [5, 6, 7, 8], out=3, session="s")
            assert p["stored_blocks"] == 3
            assert list(ask_status(svc.sock, 5.0)["engines"]) == [e.sched.engine_id]
        finally:
            e.close()
    finally:
        peer.close(0)
        ctx.term()
        assert svc.stop() == 0, svc.stderr()


def test_a_servable_wait_without_end_is_refused_and_the_service_keeps_serving(
        tmp_path: Path) -> None:
    """A store's ``servable`` held for a write in flight with ``wait_s`` = inf (its
    deadline stopped the loop: "cannot convert float infinity to integer")."""
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock").start()
    cfg = small_config(f"store.node=unix:{svc.sock}", "store.node_timeout_s=5")
    a, b = FlatCakeStore.open(svc.root, SMALL, cfg), FlatCakeStore.open(svc.root, SMALL, cfg)
    try:
        keys = session_keys(1, 6)
        kv = random_kv(SMALL, 8, seed=3)
        assert a.store_turn("s1", keys[:3], kv, list(range(3)), TO_SSD).num_blocks == 3
        assert a.control.prepare_store("s1", keys, turn_index=1, context_tokens=0)
        remote: Any = b.control  # its socket and id, to send what a store never would
        for wait_s in (float("inf"), float("nan"), -1.0):
            with pytest.raises(wire.NodeRefused, match="wait_s"):
                remote._client.call(wire.CONTROL, remote._id, wire.SERVABLE, (tuple(keys),),
                                    {"wait_s": wait_s})
        assert svc.proc is not None and svc.proc.poll() is None, svc.stderr()
        assert len(ask_status(svc.sock, 5.0)["stores"]) == 2
    finally:
        a.close()
        b.close()
        assert svc.stop() == 0, svc.stderr()
