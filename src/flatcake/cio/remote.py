"""Remote memory through NIXL: a node's agent serves its host arena, peers READ from it.

Each node runs one NIXL agent (UCX backend). It registers two DRAM regions: the *arena*
(the node's host-memory blocks, which peers read) and a *window* (where this node's own
remote reads land, to be checksummed before a block is used). Agents find each other
through the cluster index (``ClusterIndex.publish_agent``): NIXL moves the bytes and its
own metadata, Redis holds the metadata; there is no socket protocol of ours.

A read is bounded: it polls the transfer until ``timeout_s``; a transfer that fails (the
owner is dead, the range is not registered) or does not finish in time is a miss
(``None``), never a hang and never partial bytes handed out as a hit.

UCX defaults set here unless the environment says otherwise: ``UCX_MODULES=^ib`` (a
process that created the UCX backend crashes at exit without it on machines without
InfiniBand) and ``UCX_NET_DEVICES=lo`` (traffic stays on loopback). ``UCX_TLS=tcp``
forces the network path instead of shared memory on one host. The reader runs without a
progress thread (it polls; a spinning thread halves throughput on a small machine); the
owner of a TCP path needs one (``progress_thread=True``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

UCX_DEFAULTS = {"UCX_MODULES": "^ib", "UCX_NET_DEVICES": "lo"}


def _nixl() -> tuple[Any, Any]:
    for name, value in UCX_DEFAULTS.items():
        os.environ.setdefault(name, value)
    from nixl._api import nixl_agent, nixl_agent_config

    return nixl_agent, nixl_agent_config


def nixl_available() -> str | None:
    """Why NIXL cannot run in this interpreter, or None."""
    try:
        _nixl()
    except ImportError as exc:
        return f"NIXL is not installed (scripts/nixl_venv.sh): {exc}"
    return None


def _va(buf: np.ndarray) -> int:
    return int(buf.ctypes.data)


class NixlNode:
    """One node's NIXL agent: serves ``arena`` (uint8, C-contiguous) to peers and owns a
    ``window_bytes`` receive window for its own remote reads."""

    def __init__(self, name: str, arena: np.ndarray, window_bytes: int, *,
                 progress_thread: bool = False) -> None:
        if not name:
            raise ValueError("a NIXL agent needs a non-empty name")
        if arena.dtype != np.uint8 or arena.ndim != 1 or not arena.flags.c_contiguous:
            raise ValueError("the arena must be a contiguous 1-D uint8 array")
        if arena.nbytes == 0 or window_bytes <= 0:
            raise ValueError("the arena and the window must not be empty")
        agent_cls, config_cls = _nixl()
        self.name = name
        self.arena = arena
        self.agent = agent_cls(name, config_cls(enable_prog_thread=progress_thread,
                                                enable_listen_thread=False, backends=["UCX"]))
        self._arena_reg = self.agent.register_memory([(_va(arena), arena.nbytes, 0, "")],
                                                     "DRAM")
        self.window = np.zeros(window_bytes, np.uint8)
        self._window_reg: Any = self.agent.register_memory(
            [(_va(self.window), self.window.nbytes, 0, "")], "DRAM")
        self._peers: dict[bytes, str] = {}
        self._retired: list[np.ndarray] = []
        self.generation = 0
        # Asked when a window is retired: may a new one be registered? (None: always.)
        # Refused, the agent has no window left (``window`` is empty) and reads no more.
        self.renew: Callable[[], bool] | None = None

    def metadata(self) -> bytes:
        """This agent's NIXL metadata, for ``ClusterIndex.publish_agent``."""
        return bytes(self.agent.get_agent_metadata())

    def record(self) -> dict[str, Any]:
        """What a peer needs besides the metadata: the agent name and the arena's place."""
        return {"agent": self.name, "base": _va(self.arena), "size": int(self.arena.nbytes)}

    def connect(self, metadata: bytes) -> str | None:
        """Load a peer's metadata (once per distinct metadata); the peer's name, or None
        when the peer cannot be reached (a miss)."""
        name = self._peers.get(metadata)
        if name is None:
            try:
                peer = self.agent.add_remote_agent(metadata)
            except Exception as exc:  # a dead owner: NIXL_ERR_BACKEND
                logger.warning("cannot connect to a peer agent: %s", exc)
                return None
            name = peer.decode() if isinstance(peer, bytes) else str(peer)
            self._peers[metadata] = name
        return name

    def read(self, peer: str, record: dict[str, Any], ranges: Sequence[tuple[int, int]], *,
             timeout_s: float = 5.0) -> np.ndarray | None:
        """READ ``ranges`` (offset in the peer's arena, length) into the window, back to
        back; the filled part of the window, or None (a miss) on failure or timeout."""
        base, size = int(record["base"]), int(record["size"])
        total = 0
        for off, length in ranges:
            if length <= 0 or off < 0 or off + length > size:
                raise ValueError(f"range ({off}, {length}) is outside the peer's arena of "
                                 f"{size} bytes")
            total += length
        if total > self.window.nbytes:
            raise ValueError(f"{total} bytes do not fit the {self.window.nbytes}-byte window")
        if not ranges:
            return self.window[:0]
        local, remote, at = [], [], _va(self.window)
        for off, length in ranges:
            local.append((at, length, 0))
            remote.append((base + off, length, 0))
            at += length
        state, handle = "ERR", None
        try:
            handle = self.agent.initialize_xfer(
                "READ", self.agent.get_xfer_descs(local, "DRAM"),
                self.agent.get_xfer_descs(remote, "DRAM"), peer)
            state = self.agent.transfer(handle)
            deadline = time.monotonic() + timeout_s
            while state == "PROC" and time.monotonic() < deadline:
                state = self.agent.check_xfer_state(handle)
        except Exception as exc:  # nixl raises its own error types: all are a miss
            logger.warning("remote read from %s failed: %s", peer, exc)
            state = "ERR"
        finally:
            if handle is not None:
                self._release(handle, state)
        if state != "DONE":
            logger.warning("remote read from %s: %s after %.1fs, a miss", peer,
                           "timed out" if state == "PROC" else "failed", timeout_s)
            return None
        return self.window[:total]

    def _release(self, handle: Any, state: str) -> None:
        try:
            self.agent.release_xfer_handle(handle)
        except Exception as exc:
            logger.warning("cannot release a NIXL transfer (%s): %s", state, exc)
        if state == "PROC":
            self.retire_window()

    def retire_window(self) -> None:
        """A transfer into the window may still land: never reuse it for another read,
        and never free it (a late write must not land in memory that was given back):
        it is kept until the agent goes. ``generation`` counts the retirements: peers
        that write into the window (staged SSD) must load this node's metadata again.
        A new window of the same size replaces it unless ``renew`` refuses."""
        nbytes = self.window.nbytes
        if self._window_reg is not None:
            self.agent.deregister_memory(self._window_reg)
            self._window_reg = None
        self._retired.append(self.window)
        self.generation += 1
        self.window = np.zeros(0, np.uint8)
        if nbytes and (self.renew is None or self.renew()):
            self.window = np.zeros(nbytes, np.uint8)
            self._window_reg = self.agent.register_memory(
                [(_va(self.window), self.window.nbytes, 0, "")], "DRAM")

    def close(self) -> None:
        for name in set(self._peers.values()):
            try:
                self.agent.remove_remote_agent(name)
            except Exception as exc:
                logger.debug("remove_remote_agent(%s): %s", name, exc)
        self._peers.clear()
        if self._window_reg is not None:
            self.agent.deregister_memory(self._window_reg)
            self._window_reg = None
        self.agent.deregister_memory(self._arena_reg)
