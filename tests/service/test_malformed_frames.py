"""One peer's malformed messages never stop the node service, nor run code in it: empty,
random, truncated, wrongly typed frames, a frame longer than the bound (100 MB: refused
by its length, the connection closed), a pickle that would run code (it is never
unpickled: the file it would make stays absent), a call of another protocol version
(refused by name), and raw bytes that are no frame at all are each answered with an
error (or the connection closed), and a real client is answered after each; a store's
held ``servable`` whose wait has no end is refused."""

from __future__ import annotations

import os
import pickle
import random
import socket
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from flatcake.connectors.node_verbs import ATTACH
from flatcake.link import verbs, wire
from flatcake.link.client import NodeClient
from flatcake.link.frames import HEADER, MAX_FRAME_BYTES, Connection, Framer, framed
from flatcake.link.wire import TensorRanks
from flatcake.service.endpoint import ask_status
from flatcake.store import FlatCakeStore
from tests.connectors.sides_harness import G, finish, settings
from tests.service.helpers import Engine, Service
from tests.store.helpers import SMALL, TO_SSD, random_kv, session_keys, small_config

CALL = wire.call_frame(0, "", verbs.STATUS.name, [])


class RunsCode:
    """Unpickled, it would make the file ``path`` (``os.system``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


def malformed(evidence: Path) -> list[tuple[str, bytes]]:
    """(what, its frame) of each malformed call."""
    rng = random.Random(40)
    code = pickle.dumps(RunsCode(evidence))
    other_version = msgspec.msgpack.encode([0, *msgspec.msgpack.decode(CALL)[1:]])
    shaped: list[Any] = [[1, 2], [wire.PROTOCOL_VERSION, 1, "", "attach", b"\x90"],
                         [wire.PROTOCOL_VERSION, "id", "", "status", b"\x90"],
                         [wire.PROTOCOL_VERSION, 1, {}, "lookup", b"\x90"], None, "x" * 1000,
                         [wire.PROTOCOL_VERSION, 1, "", 7, b"\x90"], {"verb": "status"}]
    messages = [("empty", b""), ("truncated", CALL[:7]),
                ("a pickle that runs code", code),
                ("an old pickled call", pickle.dumps((0, "", "status", ()))),
                ("a pickle as a call's arguments", wire.encode(wire.Call(
                    wire.PROTOCOL_VERSION, 1, "", "attach", msgspec.Raw(code)))),
                ("another protocol version", other_version),
                ("100 MB of random bytes", rng.randbytes(100 << 20)),
                ("a call with 100 MB of arguments", wire.call_frame(
                    1, "", "status", [b"\0" * (100 << 20)])),
                *[(f"shaped {x!r:.40}", msgspec.msgpack.encode(x)) for x in shaped]]
    for i in range(40):
        messages.append((f"random {i}", rng.randbytes(rng.randrange(0, 300))))
    return messages


def test_malformed_messages_are_answered_and_the_service_keeps_serving(tmp_path: Path
                                                                       ) -> None:
    evidence = tmp_path / "code-ran"
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock").start()
    peer = Connection(str(svc.sock), 5.0)
    try:
        for what, frame in malformed(evidence):
            over = len(frame) > MAX_FRAME_BYTES
            # Over the bound: its length is enough to refuse it (the rest never read).
            peer.sock.sendall(HEADER.pack(len(frame)) + frame[:1 << 16])
            reply = wire.decode_reply(peer.recv(time.monotonic() + 20))
            # Answered as an error, and the service still answers a real client.
            assert reply.ok is False and reply.error, what
            assert svc.proc is not None and svc.proc.poll() is None, (what, svc.stderr())
            assert ask_status(svc.sock, 5.0)["root"] == str(svc.root), what
            if over:  # refused by its length; the stream cannot be framed past it
                assert f"a frame of {len(frame)} bytes, over the {MAX_FRAME_BYTES}" \
                    in reply.error, what
                with pytest.raises(ConnectionResetError):
                    peer.recv(time.monotonic() + 20)
                peer.close()
                peer = Connection(str(svc.sock), 5.0)
            if what == "another protocol version":
                assert (f"{wire.OTHER_VERSION} 0 of the client; this node service speaks "
                        f"{wire.OTHER_VERSION} {wire.PROTOCOL_VERSION}") in reply.error
        # Raw bytes that are no frame (a length, then not as many bytes; random
        # lengths), each on a connection of its own, closed by the peer or the service.
        rng = random.Random(41)
        for raw in [HEADER.pack(100) + b"x" * 10, *[rng.randbytes(rng.randrange(1, 300))
                                                   for _ in range(20)]]:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(str(svc.sock))
                s.sendall(raw)
            assert ask_status(svc.sock, 5.0)["root"] == str(svc.root)
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
        peer.close()
        assert svc.stop() == 0, svc.stderr()


def test_a_call_over_the_frame_bound_or_of_a_verb_gone_is_refused(tmp_path: Path) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock").start()
    client = NodeClient(str(svc.sock), 5.0)
    try:
        with pytest.raises(wire.NodeRefused, match=f"over the {MAX_FRAME_BYTES}"):
            client.call(verbs.SERVABLE, "s0", (b"\0" * (MAX_FRAME_BYTES + 1),))
        # complete_copy: an attached store tells its copy with end_store (never alone).
        # The verb is refused by name before its arguments are read.
        gone = verbs.Verb("complete_copy", None, ("plan", int))
        with pytest.raises(wire.NodeRefused, match="unknown call 'complete_copy'"):
            client.call(gone, "s0", 0)
        assert client.call(verbs.STATUS)["root"] == str(svc.root)
    finally:
        client.close()
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
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock))
    listener.listen()
    listener.settimeout(5.0)
    client = NodeClient(f"unix:{sock}", 1.0)

    def answer(as_value: bool) -> None:
        conn, _ = listener.accept()  # the client's probe (its listener's uid) ...
        conn.close()
        conn, _ = listener.accept()  # ... then its connection
        framer = Framer()
        frames: list[bytes] = []
        while not frames:
            frames = framer.feed(conn.recv(1 << 16))
        call_id = wire.decode_call(frames[0]).call_id
        conn.sendall(framed(wire.answer_frame(call_id, code) if as_value else code))
        time.sleep(1.5)  # the client times out (a frame that is not an answer) or reads
        conn.close()

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
        listener.close()


def test_an_engine_speaking_zeromq_is_named_once_and_closed(tmp_path: Path) -> None:
    """An engine with a FlatCake older than the framed socket sends ZeroMQ's greeting:
    the service says so in its log (once per process: ZeroMQ reconnects on its own)
    and closes it at once, not after the silent connections' 5 s."""
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock").start()
    try:
        for _ in range(2):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as old:
                old.settimeout(3.0)
                old.connect(str(svc.sock))
                old.sendall(b"\xff" + bytes(8) + b"\x7f\x03")  # ZMTP 3 signature, major
                assert old.recv(1) == b""  # closed before the handshake bound
        assert ask_status(svc.sock, 5.0)["root"] == str(svc.root)
    finally:
        assert svc.stop() == 0, svc.stderr()
    assert svc.stderr().count("speaks ZeroMQ") == 1
