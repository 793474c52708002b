"""One peer's malformed messages never stop the node service, nor run code in it: a
DEALER's two-frame ``send_multipart`` (it killed the service: "too many values to
unpack"), empty, random, truncated, wrongly typed, 100 MB frames, a pickle that would run
code (it is never unpickled: the file it would make stays absent), and a call of another
protocol version (refused by name) are each answered with an error, and a real client
is answered after each; a store's held ``servable`` whose wait has no end is refused."""

from __future__ import annotations

import os
import pickle
import random
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from flatcake.connectors.node_verbs import ATTACH
from flatcake.link import verbs, wire
from flatcake.link.client import NodeClient
from flatcake.link.wire import TensorRanks
from flatcake.service.endpoint import ask_status
from flatcake.store import FlatCakeStore
from tests.connectors.sides_harness import G, finish, settings
from tests.service.helpers import Engine, Service
from tests.store.helpers import SMALL, TO_SSD, random_kv, session_keys, small_config

zmq = pytest.importorskip("zmq")

CALL = wire.call_frame(0, "", verbs.STATUS.name, [])


class RunsCode:
    """Unpickled, it would make the file ``path`` (``os.system``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


def malformed(evidence: Path) -> list[tuple[str, list[bytes]]]:
    """(what, frames) of each malformed message."""
    rng = random.Random(40)
    code = pickle.dumps(RunsCode(evidence))
    other_version = msgspec.msgpack.encode([0, *msgspec.msgpack.decode(CALL)[1:]])
    shaped: list[Any] = [[1, 2], [wire.PROTOCOL_VERSION, 1, "", "attach", b"\x90"],
                         [wire.PROTOCOL_VERSION, "id", "", "status", b"\x90"],
                         [wire.PROTOCOL_VERSION, 1, {}, "lookup", b"\x90"], None, "x" * 1000,
                         [wire.PROTOCOL_VERSION, 1, "", 7, b"\x90"], {"verb": "status"}]
    messages = [("two frames", [b"a", b"b"]),  # a DEALER's send_multipart: killed it once
                ("two calls", [CALL, CALL]), ("three empty", [b"", b"", b""]),
                ("empty", [b""]), ("truncated", [CALL[:7]]),
                ("a pickle that runs code", [code]),
                ("an old pickled call", [pickle.dumps((0, "", "status", ()))]),
                ("a pickle as a call's arguments", [wire.encode(wire.Call(
                    wire.PROTOCOL_VERSION, 1, "", "attach", msgspec.Raw(code)))]),
                ("another protocol version", [other_version]),
                ("100 MB of random bytes", [rng.randbytes(100 << 20)]),
                ("a call with 100 MB of arguments", [wire.call_frame(
                    1, "", "status", [b"\0" * (100 << 20)])]),
                *[(f"shaped {x!r:.40}", [msgspec.msgpack.encode(x)]) for x in shaped]]
    for i in range(40):  # random bytes, 1 to 5 frames
        messages.append((f"random {i}", [rng.randbytes(rng.randrange(0, 300))
                                         for _ in range(rng.randrange(1, 6))]))
    return messages


def test_malformed_messages_are_answered_and_the_service_keeps_serving(tmp_path: Path
                                                                       ) -> None:
    evidence = tmp_path / "code-ran"
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock").start()
    ctx = zmq.Context()
    peer = ctx.socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.connect(wire.endpoint(svc.sock))
    try:
        for what, frames in malformed(evidence):
            peer.send_multipart(frames)
            assert peer.poll(20000), (what, svc.stderr())
            reply = wire.decode_reply(peer.recv())
            # Answered as an error, and the service still answers a real client.
            assert reply.ok is False and reply.error, what
            assert svc.proc is not None and svc.proc.poll() is None, (what, svc.stderr())
            assert ask_status(svc.sock, 5.0)["root"] == str(svc.root), what
            if what == "two frames":
                assert "malformed call: 2 frames, a call is one" in reply.error
            if what == "another protocol version":
                assert (f"{wire.OTHER_VERSION} 0 of the client; this node service speaks "
                        f"{wire.OTHER_VERSION} {wire.PROTOCOL_VERSION}") in reply.error
        assert not evidence.exists()  # no pickle was loaded
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


def test_an_attach_of_another_protocol_version_is_refused_by_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock").start()
    client = NodeClient(str(svc.sock), 5.0)
    try:
        monkeypatch.setattr(wire, "PROTOCOL_VERSION", wire.PROTOCOL_VERSION + 1)
        with pytest.raises(wire.NodeRefused, match=f"{wire.OTHER_VERSION} "
                           f"{wire.PROTOCOL_VERSION} of the client; this node service "
                           f"speaks {wire.OTHER_VERSION} {wire.PROTOCOL_VERSION - 1}"):
            client.call(ATTACH, "", "newer", os.getpid(), G, TensorRanks(), settings())
        monkeypatch.undo()
        # Nothing attached; one of this version attaches.
        assert ask_status(svc.sock, 5.0)["engines"] == {}
        assert client.call(ATTACH, "", "same", os.getpid(), G, TensorRanks(),
                           settings()).engine_id
    finally:
        client.close()
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
                remote._client.call(verbs.SERVABLE, remote._id, tuple(keys), 0, wait_s)
        assert svc.proc is not None and svc.proc.poll() is None, svc.stderr()
        assert len(ask_status(svc.sock, 5.0)["stores"]) == 2
    finally:
        a.close()
        b.close()
        assert svc.stop() == 0, svc.stderr()


def test_a_client_runs_no_code_from_a_listeners_reply(tmp_path: Path) -> None:
    # A listener of the client's own user answers a call with a pickle that would run
    # code, as a frame of its own and as an answer's value (issue 40: a planted
    # listener's reply was unpickled by root's client). Neither is unpickled: the
    # client skips the one (not an answer: it times out), refuses the other, and the
    # file stays absent.
    evidence = tmp_path / "ran"
    code = pickle.dumps(RunsCode(evidence))
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    sock = run / "node.sock"
    ctx = zmq.Context()
    listener = ctx.socket(zmq.ROUTER)
    listener.setsockopt(zmq.LINGER, 0)
    listener.bind(wire.endpoint(sock))
    client = NodeClient(f"unix:{sock}", 1.0)

    def answer(as_value: bool) -> None:
        assert listener.poll(5000)
        who, frame = listener.recv_multipart()
        call_id = wire.decode_call(frame).call_id
        listener.send_multipart([who, wire.answer_frame(call_id, code) if as_value
                                 else code])

    try:
        for as_value, error in ((False, wire.NodeUnavailable), (True, wire.NodeRefused)):
            t = threading.Thread(target=answer, args=(as_value,))
            t.start()
            with pytest.raises(error):
                client.call(verbs.STATUS)
            t.join(10)
        assert not evidence.exists()
    finally:
        client.close()
        listener.close(0)
        ctx.term()
