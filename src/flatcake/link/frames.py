"""The node service's transport: frames over a unix stream socket (``SOCK_STREAM``), no
broker, no I/O thread on either side. A frame is its length, then its bytes::

    +----------------+---------------------------+
    | length: u32 LE | body (a msgpack Call or   |
    | <= MAX_FRAME   | Reply, ``link.wire``)     |
    +----------------+---------------------------+

One connection carries one client's calls in order and their answers; the service
answers each call of a connection in the order it read them (a held ``servable`` later).
A length over ``MAX_FRAME_BYTES`` is refused by name and its connection closed (what
follows it cannot be framed). ``Framer`` cuts frames out of what a socket gave (the
service's loop, non-blocking); ``Connection`` is a client's blocking socket with a
deadline per receive.
"""

from __future__ import annotations

import socket
import struct
import time

HEADER = struct.Struct("<I")
_TIMEVAL = struct.Struct("@ll")  # struct timeval: seconds, microseconds
MAX_FRAME_BYTES = 64 << 20  # a call or answer of more is refused (a lookup of 2K blocks: ~80 KB)
RECV_BYTES = 1 << 16  # one read of a socket
_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)  # EPIPE raised, never SIGPIPE


class FrameTooLarge(ValueError):
    """A frame's length over ``MAX_FRAME_BYTES`` (the message names both)."""


def framed(body: bytes) -> bytes:
    """``body`` with its length in front, as it goes on the socket."""
    if len(body) > MAX_FRAME_BYTES:
        raise FrameTooLarge(too_large(len(body)))
    return HEADER.pack(len(body)) + body


def too_large(n: int) -> str:
    return f"a frame of {n} bytes, over the {MAX_FRAME_BYTES} a call or answer may be"


class Framer:
    """The frames in a byte stream, as its pieces arrive (see the module)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The frames ``data`` completes (in order); raises ``FrameTooLarge`` at a length
        over the bound (the stream cannot be read past it)."""
        buf = self._buf
        if not buf and len(data) >= 4:  # the common case: whole frames in one read
            (n,) = HEADER.unpack_from(data)
            if len(data) == 4 + n:
                if n > MAX_FRAME_BYTES:
                    raise FrameTooLarge(too_large(n))
                return [data[4:]]
        buf += data
        out = []
        start = 0
        while len(buf) - start >= 4:
            (n,) = HEADER.unpack_from(buf, start)
            if n > MAX_FRAME_BYTES:
                raise FrameTooLarge(too_large(n))
            if len(buf) - start < 4 + n:
                break
            out.append(bytes(buf[start + 4:start + 4 + n]))
            start += 4 + n
        del buf[:start]
        return out


class Connection:
    """A client's connection to the socket ``path`` (blocking; see the module). Raises
    ``OSError`` when it cannot connect or the service closed it, ``TimeoutError`` when
    no frame arrives in time.

    The socket blocks and the kernel keeps its deadlines (``SO_SNDTIMEO``,
    ``SO_RCVTIMEO``), set again only when a wait differs from the last by more than
    ``SLACK_S``: a call is one ``send`` and one ``recv`` (a Python timeout costs each a
    ``poll`` first, and each receive an ``ioctl``)."""

    SLACK_S = 0.001  # a receive may wait this much past its deadline

    def __init__(self, path: str, timeout_s: float) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.settimeout(timeout_s)
            self.sock.connect(path)
            self.sock.settimeout(None)
            self._wait_s = 0.0
            self._set_wait(socket.SO_SNDTIMEO, timeout_s)
            self._set_wait(socket.SO_RCVTIMEO, timeout_s)
        except OSError:
            self.sock.close()
            raise
        self._framer = Framer()
        self._ready: list[bytes] = []

    def _set_wait(self, option: int, wait_s: float) -> None:
        usec = max(1, int(wait_s * 1e6))  # 0 would wait forever
        self.sock.setsockopt(socket.SOL_SOCKET, option,
                             _TIMEVAL.pack(usec // 1_000_000, usec % 1_000_000))
        if option == socket.SO_RCVTIMEO:
            self._wait_s = wait_s

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, body: bytes) -> None:
        try:
            self.sock.sendall(framed(body), _SEND_FLAGS)
        except BlockingIOError:  # SO_SNDTIMEO passed: the service reads nothing
            raise TimeoutError("the node service took no frame in time") from None

    def recv(self, deadline: float) -> bytes:
        """The next frame, waiting until ``deadline`` (``time.monotonic()``)."""
        while not self._ready:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame in time")
            if abs(left - self._wait_s) > self.SLACK_S:
                self._set_wait(socket.SO_RCVTIMEO, left)
            try:
                data = self.sock.recv(RECV_BYTES)
            except BlockingIOError:  # SO_RCVTIMEO passed
                raise TimeoutError("no frame in time") from None
            if not data:
                raise ConnectionResetError("the node service closed the connection")
            self._ready.extend(self._framer.feed(data))
        return self._ready.pop(0)

    def close(self) -> None:
        self.sock.close()
