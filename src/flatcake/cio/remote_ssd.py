"""Remote SSD through NIXL, staged by the owner (NIXL cannot READ a peer's file).

The requester sends the owner a NIXL notification naming the byte ranges it wants (file
id, offset, length), grouped in *parts* (one per layer, say), and where its registered
window is. The owner plans each part as FC-CIO does (``stage_plan``: ranges of one file
that touch merge into one read, every read widened to 4 KiB for O_DIRECT), reads it with
O_DIRECT into one half of its registered staging buffer and WRITEs the wanted bytes into
the requester's window, back to back, with a notification once a part has landed. The
two halves alternate: the owner reads the next chunk while the previous one is in
flight, and the requester can use part ``i`` while part ``i + 1`` is still coming. The
requester checks the bytes (checksums in the segment record) before using a block. A
missing file or a failed read is answered with a failure notification; a dead or slow
owner is a miss after ``timeout_s``, never a hang.

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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flatcake.cio.remote import NixlNode

logger = logging.getLogger(__name__)

REQUEST = b"fcssd:"
ALIGN = 4096
_ids = itertools.count(1)

Range = tuple[str, int, int]  # (file id on the owner, offset, length)


def fetch(node: NixlNode, peer: str, parts: Sequence[Sequence[Range]], *,
          timeout_s: float = 10.0,
          on_part: Callable[[int, np.ndarray], bool] | None = None) -> np.ndarray | None:
    """Ask ``peer`` to stage ``parts`` into this node's window, back to back; the filled
    part of the window once every part landed, or None (a miss). ``on_part(i, bytes)``
    runs for each part in order as soon as it and the ones before it landed (while
    later parts are still coming); False from it makes the fetch a miss (the parts
    still coming are waited for, so the window is free again after it)."""
    total = sum(length for part in parts for _, _, length in part)
    if total > node.window.nbytes:
        raise ValueError(f"{total} bytes do not fit the {node.window.nbytes}-byte window")
    for part in parts:
        if not part:
            raise ValueError("an empty part")
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
    tags = {f"fcpart:{rid}:{i}".encode(): i for i in range(len(parts))}
    ends = list(itertools.accumulate(sum(n for _, _, n in part) for part in parts))
    landed: set[int] = set()
    used = 0  # parts handed to on_part
    refused = False  # on_part refused one: drain the rest, then a miss
    fail = f"fcfail:{rid}".encode()
    deadline = time.monotonic() + timeout_s
    while len(landed) < len(parts) and time.monotonic() < deadline:
        try:
            got = node.agent.get_new_notifs().get(peer, [])
        except Exception as exc:
            logger.warning("remote SSD read from %s failed: %s", peer, exc)
            return None
        if fail in got:
            logger.warning("remote SSD read from %s: the owner could not serve it", peer)
            return None
        # Answers to earlier, abandoned requests are ignored.
        landed.update(tags[m] for m in got if m in tags)
        while on_part is not None and not refused and used in landed:
            start = ends[used - 1] if used else 0
            refused = not on_part(used, node.window[start:ends[used]])
            used += 1
        if not got:
            time.sleep(0.0001)  # leave the CPU to the owner's reads meanwhile
    if len(landed) < len(parts):
        logger.warning("remote SSD read from %s timed out after %.1fs, a miss", peer,
                       timeout_s)
        node.retire_window()  # a late part may still land there
        return None
    return None if refused else node.window[:total]


@dataclass(slots=True)
class StageRead:
    """One O_DIRECT read of a chunk: ``length`` bytes at ``offset`` of ``path`` (both
    multiples of 4096) into the half at ``at``; ``pieces`` are the wanted bytes in it,
    ``(offset in the read, length)``, in request order."""

    path: str
    offset: int
    length: int
    at: int
    pieces: list[tuple[int, int]] = field(default_factory=list)

    @property
    def wanted_end(self) -> int:
        """File offset just past the last wanted byte."""
        delta, n = self.pieces[-1]
        return self.offset + delta + n


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def stage_plan(ranges: Sequence[tuple[str, int, int]], half_bytes: int
               ) -> list[list[StageRead]]:
    """One part's ranges ``(path, offset, length)`` in request order -> chunks of reads
    that each fit ``half_bytes``: a range that starts where the previous one of the same
    file ended extends its read, every read is widened to 4 KiB, and a range longer
    than a half is split."""
    if half_bytes < 2 * ALIGN or half_bytes % ALIGN:
        raise ValueError(f"a staging half of {half_bytes} bytes: at least 8 KiB, 4 KiB "
                         "multiples")
    step = half_bytes - ALIGN  # a piece of it, widened, still fits a half
    chunks: list[list[StageRead]] = []
    cur: list[StageRead] = []
    used = 0
    for path, offset, length in ranges:
        for off in range(offset, offset + length, step):
            n = min(step, offset + length - off)
            last = cur[-1] if cur else None
            if last is not None and last.path == path and last.wanted_end == off:
                grown = _up(off + n) - last.offset
                if used - last.length + grown <= half_bytes:
                    last.pieces.append((off - last.offset, n))
                    used += grown - last.length
                    last.length = grown
                    continue
            lo = off // ALIGN * ALIGN
            size = _up(off + n) - lo
            if used + size > half_bytes:
                chunks.append(cur)
                cur, used = [], 0
            cur.append(StageRead(path, lo, size, used, [(off - lo, n)]))
            used += size
    if cur:
        chunks.append(cur)
    return chunks


def _aligned(nbytes: int) -> np.ndarray:
    raw = np.zeros(nbytes + ALIGN, np.uint8)
    skip = (-int(raw.ctypes.data)) % ALIGN
    return raw[skip:skip + nbytes]


class StagingServer:
    """The owner's side: answers ``fcssd`` requests from ``files`` (file id -> path).

    ``resolve(agent_name)`` returns a requester's NIXL metadata (from the cluster index)
    the first time it asks; ``stage_bytes`` (two halves) bounds one chunk's reads."""

    def __init__(self, node: NixlNode, files: Callable[[str], str | None],
                 resolve: Callable[[str], bytes | None], stage_bytes: int,
                 *, write_timeout_s: float = 10.0) -> None:
        half = stage_bytes // 2 // ALIGN * ALIGN
        if half < 2 * ALIGN:
            raise ValueError(f"stage_bytes must be at least {4 * ALIGN}, got {stage_bytes}")
        self.node = node
        self.files = files
        self.resolve = resolve
        self.write_timeout_s = write_timeout_s
        self.stage = _aligned(2 * half)
        self.halves = (0, half)
        self.half_bytes = half
        self._reg = node.agent.register_memory(
            [(int(self.stage.ctypes.data), self.stage.nbytes, 0, "")], "DRAM")
        self.served = 0
        self.reads = 0  # read calls, for stats and tests

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
        fds: dict[str, int] = {}
        try:
            jobs: list[tuple[list[StageRead], bytes]] = []
            for i, part in enumerate(body["parts"]):
                chunks = stage_plan([(self._path(str(f)), int(o), int(n))
                                     for f, o, n in part], self.half_bytes)
                if not chunks:
                    raise ValueError(f"part {i} is empty")
                tag = f"fcpart:{rid}:{i}".encode()
                jobs.extend((c, tag if j == len(chunks) - 1 else b"")
                            for j, c in enumerate(chunks))
            self._pipeline(peer, int(body["window"]), jobs, fds)
        except (OSError, ValueError, RuntimeError) as exc:
            logger.warning("remote SSD request %s from %s failed: %s", rid, requester, exc)
            self.node.agent.send_notif(peer, f"fcfail:{rid}".encode())
        finally:
            for fd in fds.values():
                os.close(fd)

    def _path(self, file_id: str) -> str:
        path = self.files(file_id)
        if path is None:
            raise ValueError(f"no file {file_id!r} here")
        return path

    def _pipeline(self, peer: str, window_at: int, jobs: list[tuple[list[StageRead], bytes]],
                  fds: dict[str, int]) -> None:
        """Read chunk k into half k % 2 while chunk k - 1 is in flight, then send it."""
        base = int(self.stage.ctypes.data)
        pending: Any = None
        try:
            for k, (chunk, tag) in enumerate(jobs):
                at = self.halves[k % 2]
                local, remote = [], []
                for read in chunk:
                    self._read(read, at, fds)
                    for delta, n in read.pieces:
                        local.append((base + at + read.at + delta, n, 0))
                        remote.append((window_at, n, 0))
                        window_at += n
                if pending is not None:
                    self._wait(pending, peer)
                    pending = None
                pending = self._start(peer, local, remote, tag)
            if pending is not None:
                self._wait(pending, peer)
                pending = None
        finally:
            if pending is not None:
                self._release(pending)

    def _read(self, read: StageRead, at: int, fds: dict[str, int]) -> None:
        fd = fds.get(read.path)
        if fd is None:
            try:
                fd = os.open(read.path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
            except OSError:  # a filesystem without O_DIRECT (tmpfs): the page cache
                fd = os.open(read.path, os.O_RDONLY)
            fds[read.path] = fd
        start = at + read.at
        got = os.preadv(fd, [self.stage[start:start + read.length].data], read.offset)
        self.reads += 1
        if got < read.pieces[-1][0] + read.pieces[-1][1]:
            raise ValueError(f"{read.path} is short at {read.offset}+{read.length}")

    def _start(self, peer: str, local: list[tuple[int, int, int]],
               remote: list[tuple[int, int, int]], tag: bytes) -> Any:
        agent = self.node.agent
        handle = agent.initialize_xfer("WRITE", agent.get_xfer_descs(local, "DRAM"),
                                       agent.get_xfer_descs(remote, "DRAM"), peer, tag)
        state = agent.transfer(handle)
        if state not in ("PROC", "DONE"):
            self._release(handle)
            raise RuntimeError(f"staged WRITE to {peer}: {state}")
        return handle

    def _wait(self, handle: Any, peer: str) -> None:
        agent = self.node.agent
        deadline = time.monotonic() + self.write_timeout_s
        state = agent.check_xfer_state(handle)
        while state == "PROC" and time.monotonic() < deadline:
            state = agent.check_xfer_state(handle)
        self._release(handle)
        if state != "DONE":
            raise RuntimeError(f"staged WRITE to {peer}: {state}")

    def _release(self, handle: Any) -> None:
        try:
            self.node.agent.release_xfer_handle(handle)
        except Exception as exc:
            logger.warning("cannot release a staged WRITE: %s", exc)

    def close(self) -> None:
        self.node.agent.deregister_memory(self._reg)
