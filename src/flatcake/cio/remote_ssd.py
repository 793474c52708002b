"""Remote SSD through NIXL, staged by the owner (NIXL cannot READ a peer's file).

The requester sends the owner a NIXL notification naming the byte ranges it wants (file
id, offset, length), grouped in *parts* (one per layer, say), and where its registered
window is. The owner reads each part from its file into its registered staging buffer and
WRITEs it into the requester's window with a notification per part, so the requester can
use part ``i`` while part ``i + 1`` is still in flight. The requester checks the bytes
(checksums in the segment record) before using a block. A missing file or a failed read
is answered with a failure notification; a dead or slow owner is a miss after
``timeout_s``, never a hang.

    request  fcssd:{"id": ID, "window": VA, "parts": [[[file, offset, length], ...], ...]}
    answers  fcpart:ID:i (part i landed)     fcfail:ID (the owner cannot serve it)
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from flatcake.cio.remote import NixlNode

logger = logging.getLogger(__name__)

REQUEST = b"fcssd:"
_ids = itertools.count(1)

Range = tuple[str, int, int]  # (file id on the owner, offset, length)


def fetch(node: NixlNode, peer: str, parts: Sequence[Sequence[Range]], *,
          timeout_s: float = 10.0) -> np.ndarray | None:
    """Ask ``peer`` to stage ``parts`` into this node's window, back to back; the filled
    part of the window once every part landed, or None (a miss)."""
    total = sum(length for part in parts for _, _, length in part)
    if total > node.window.nbytes:
        raise ValueError(f"{total} bytes do not fit the {node.window.nbytes}-byte window")
    for part in parts:
        for file_id, offset, length in part:
            if not file_id or offset < 0 or length <= 0:
                raise ValueError(f"bad range ({file_id!r}, {offset}, {length})")
    rid = f"{os.getpid()}-{next(_ids)}"
    body = {"id": rid, "window": int(node.window.ctypes.data),
            "parts": [[list(r) for r in part] for part in parts]}
    try:
        node.agent.send_notif(peer, REQUEST + json.dumps(body).encode())
    except Exception as exc:
        logger.warning("remote SSD request to %s failed: %s", peer, exc)
        return None
    pending = {f"fcpart:{rid}:{i}".encode() for i in range(len(parts))}
    fail = f"fcfail:{rid}".encode()
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        try:
            got = node.agent.get_new_notifs().get(peer, [])
        except Exception as exc:
            logger.warning("remote SSD read from %s failed: %s", peer, exc)
            return None
        if fail in got:
            logger.warning("remote SSD read from %s: the owner could not serve it", peer)
            return None
        pending.difference_update(got)  # answers to earlier, abandoned requests: ignored
    if pending:
        logger.warning("remote SSD read from %s timed out after %.1fs, a miss", peer,
                       timeout_s)
        node.retire_window()  # a late part may still land there
        return None
    return node.window[:total]


class StagingServer:
    """The owner's side: answers ``fcssd`` requests from ``files`` (file id -> path).

    ``resolve(agent_name)`` returns a requester's NIXL metadata (from the cluster index)
    the first time it asks; ``stage_bytes`` bounds one part."""

    def __init__(self, node: NixlNode, files: Callable[[str], str | None],
                 resolve: Callable[[str], bytes | None], stage_bytes: int,
                 *, write_timeout_s: float = 10.0) -> None:
        if stage_bytes <= 0:
            raise ValueError("stage_bytes must be positive")
        self.node = node
        self.files = files
        self.resolve = resolve
        self.write_timeout_s = write_timeout_s
        self.stage = np.zeros(stage_bytes, np.uint8)
        self._reg = node.agent.register_memory(
            [(int(self.stage.ctypes.data), stage_bytes, 0, "")], "DRAM")
        self.served = 0

    def serve_once(self) -> int:
        """Answer the requests that arrived; the number answered."""
        done = 0
        for sender, messages in self.node.agent.get_new_notifs().items():
            name = sender.decode() if isinstance(sender, bytes) else str(sender)
            for message in messages:
                if message.startswith(REQUEST):
                    self._answer(name, json.loads(message[len(REQUEST):]))
                    done += 1
        self.served += done
        return done

    def _answer(self, requester: str, body: dict[str, Any]) -> None:
        rid = str(body["id"])
        peer = None
        md = self.resolve(requester)
        if md is not None:
            peer = self.node.connect(md)
        if peer is None:
            logger.warning("remote SSD request from unknown agent %s dropped", requester)
            return
        try:
            at = int(body["window"])
            for i, part in enumerate(body["parts"]):
                n = self._read_part(part)
                self._write(peer, at, n, f"fcpart:{rid}:{i}".encode())
                at += n
        except (OSError, ValueError, RuntimeError) as exc:
            logger.warning("remote SSD request %s from %s failed: %s", rid, requester, exc)
            self.node.agent.send_notif(peer, f"fcfail:{rid}".encode())

    def _read_part(self, part: list[list[Any]]) -> int:
        n = 0
        for file_id, offset, length in part:
            path = self.files(str(file_id))
            length, offset = int(length), int(offset)
            if path is None:
                raise ValueError(f"no file {file_id!r} here")
            if n + length > self.stage.nbytes:
                raise ValueError(f"a part of more than {self.stage.nbytes} bytes")
            fd = os.open(path, os.O_RDONLY)
            try:
                got = os.preadv(fd, [self.stage[n:n + length].data], offset)
            finally:
                os.close(fd)
            if got != length:
                raise ValueError(f"{file_id!r} is short at {offset}+{length}")
            n += length
        return n

    def _write(self, peer: str, window_at: int, n: int, tag: bytes) -> None:
        agent = self.node.agent
        handle = agent.initialize_xfer(
            "WRITE", agent.get_xfer_descs([(int(self.stage.ctypes.data), n, 0)], "DRAM"),
            agent.get_xfer_descs([(window_at, n, 0)], "DRAM"), peer, tag)
        try:
            state = agent.transfer(handle)
            deadline = time.monotonic() + self.write_timeout_s
            while state == "PROC" and time.monotonic() < deadline:
                state = agent.check_xfer_state(handle)
        finally:
            agent.release_xfer_handle(handle)
        if state != "DONE":
            raise RuntimeError(f"staged WRITE to {peer}: {state}")

    def close(self) -> None:
        self.node.agent.deregister_memory(self._reg)
