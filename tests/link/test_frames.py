"""The node service's transport: frames cut out of a byte stream however it arrives
(whole, several in one read, split at every byte), a length over the bound refused by
its length alone, and a connection's frames read in order within a deadline."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from flatcake.link.frames import (
    HEADER,
    MAX_FRAME_BYTES,
    Connection,
    Framer,
    FrameTooLarge,
    framed,
)

BODIES = [b"", b"a", b"\x00" * 3, bytes(range(256)) * 40, b"call"]


def test_frames_are_cut_out_however_the_stream_is_split() -> None:
    stream = b"".join(framed(b) for b in BODIES)
    assert Framer().feed(stream) == BODIES  # several in one read
    for cut in range(len(stream) + 1):  # two reads, split at every byte
        f = Framer()
        assert f.feed(stream[:cut]) + f.feed(stream[cut:]) == BODIES, cut
    f = Framer()  # one byte a read
    assert [x for i in range(len(stream)) for x in f.feed(stream[i:i + 1])] == BODIES


def test_a_length_over_the_bound_is_refused_by_its_length() -> None:
    with pytest.raises(FrameTooLarge, match=f"a frame of {MAX_FRAME_BYTES + 1} bytes"):
        Framer().feed(HEADER.pack(MAX_FRAME_BYTES + 1) + b"x")  # the rest never read
    f = Framer()
    assert f.feed(framed(b"ok") + HEADER.pack(MAX_FRAME_BYTES)[:2]) == [b"ok"]
    assert f.feed(HEADER.pack(MAX_FRAME_BYTES)[2:]) == []  # at the bound: waits for it
    with pytest.raises(FrameTooLarge):
        framed(b"\0" * (MAX_FRAME_BYTES + 1))


def test_a_connection_reads_its_frames_in_order_within_a_deadline(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while len(data) < len(framed(b"ping")):
                data += conn.recv(100)
            stream = b"".join(framed(b) for b in BODIES)
            for i in range(0, len(stream), 7):  # in pieces
                conn.sendall(stream[i:i + 7])
            time.sleep(0.5)

    t = threading.Thread(target=serve)
    t.start()
    c = Connection(str(path), 5.0)
    try:
        c.send(b"ping")
        assert [c.recv(time.monotonic() + 5) for _ in BODIES] == BODIES
        with pytest.raises(TimeoutError):  # nothing more within its deadline
            c.recv(time.monotonic() + 0.1)
        t.join(5)
        with pytest.raises(ConnectionResetError):  # the peer closed it
            c.recv(time.monotonic() + 5)
    finally:
        c.close()
        listener.close()


def test_a_connection_blocks_and_the_kernel_keeps_each_deadline(tmp_path: Path) -> None:
    """No Python timeout (each would cost a send and a receive a ``poll`` first): the
    socket blocks, with the kernel's send and receive deadlines, set again for a wait
    longer or shorter than the last."""
    path = tmp_path / "s.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    done = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            for delay in (0.4, 0.0):  # past the connection's timeout, then at once
                conn.recv(100)
                time.sleep(delay)
                conn.sendall(framed(b"late"))
            conn.recv(100)  # a last call, never answered
            done.wait(10)

    t = threading.Thread(target=serve)
    t.start()
    c = Connection(str(path), 0.1)
    try:
        assert c.sock.gettimeout() is None
        c.send(b"wait")  # a call that may wait past the timeout (``wait_s``)
        assert c.recv(time.monotonic() + 5) == b"late"
        c.send(b"now")
        assert c.recv(time.monotonic() + 0.1) == b"late"
        c.send(b"never")
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            c.recv(start + 0.2)
        assert 0.2 <= time.monotonic() - start < 2.0
    finally:
        done.set()
        c.close()
        listener.close()
        t.join(5)
