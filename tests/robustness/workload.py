"""Deterministic sessions for the robustness suite: every block's bytes follow from its
session number, so any process (a writer that gets killed, the checker that reopens
the store after it) knows what each restored byte must be.

``Oracle`` is the checker's side: ``verify`` loads a session and asserts the two
properties every test in this package is about: no wrong byte is ever served, and an
acknowledged turn is either restored or reported damaged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import torch

from flatcake.store import FlatCakeStore, TurnSignals
from tests.store.helpers import SMALL, empty_kv, random_kv, session_keys, small_config

MAX_BLOCKS = 48  # blocks a session grows to
TO_SSD = TurnSignals(turn_index=0, context_tokens=0)


def config(*overrides: str):  # type: ignore[no-untyped-def]
    return small_config("store.read_threads=1", "scheduler.max_restores_in_flight=1",
                        *overrides)


@cache
def source(session: int) -> list[torch.Tensor]:
    """The paged KV a session's blocks are stored from (slot ``i`` = block ``i``)."""
    return random_kv(SMALL, MAX_BLOCKS, seed=session)


@cache
def keys(session: int) -> tuple[bytes, ...]:
    return tuple(session_keys(session, MAX_BLOCKS))


def session_name(session: int) -> str:
    return f"session-{session}"


def store_turn(store: FlatCakeStore, session: int, end: int) -> bool:
    """Store blocks ``[0, end)`` of a session (the new ones); True when acknowledged
    on SSD (``store_turn`` returned with them durable)."""
    res = store.store_turn(session_name(session), keys(session)[:end], source(session),
                           range(end), TO_SSD)
    return res.num_blocks > 0 and not res.error


def served_bytes_ok(dst: list[torch.Tensor], session: int, n: int) -> bool:
    src = source(session)  # compared as bytes: random float16 bits hold NaNs
    return all(torch.equal(dst[layer][:, :n].contiguous().view(torch.uint8),
                           src[layer][:, :n].contiguous().view(torch.uint8))
               for layer in range(SMALL.num_layers))


@dataclass
class Verdict:
    """Counters over many checks (what the long runs report)."""

    sessions: int = 0
    kills: int = 0
    acknowledged_turns: int = 0
    restored_turns: int = 0
    reported_lost_turns: int = 0
    unreported_lost_turns: int = 0
    wrong_bytes: int = 0
    notes: list[str] = field(default_factory=list)


def verify(store: FlatCakeStore, session: int, acked: list[int], verdict: Verdict,
           reported: bool) -> int:
    """Load a session; count its acknowledged turns (their ends, ``acked``) restored,
    lost with a damage report (``reported``, or the load's own report), or lost
    silently; count wrong bytes. Returns the blocks restored."""
    n = MAX_BLOCKS
    dst = empty_kv(SMALL, n)
    res = store.load(keys(session), dst, range(n))
    verdict.sessions += 1
    if not served_bytes_ok(dst, session, res.num_blocks):
        verdict.wrong_bytes += 1
        verdict.notes.append(f"session {session}: wrong bytes in [0, {res.num_blocks})")
    # Past the loaded prefix a slot may hold layers that passed their own crc before a
    # later layer failed (the caller recomputes those blocks): zeros or the right bytes.
    src = source(session)
    for layer in range(SMALL.num_layers):
        for b in range(res.num_blocks, n):
            got = dst[layer][:, b].contiguous().view(torch.uint8)
            if got.any() and not torch.equal(got, src[layer][:, b].contiguous().view(
                    torch.uint8)):
                verdict.wrong_bytes += 1
                verdict.notes.append(f"session {session}: wrong bytes in block {b} layer "
                                     f"{layer}, past the loaded prefix {res.num_blocks}")
    for end in acked:
        verdict.acknowledged_turns += 1
        if end <= res.num_blocks:
            verdict.restored_turns += 1
        elif reported or res.damaged_segments:
            verdict.reported_lost_turns += 1
        else:
            verdict.unreported_lost_turns += 1
            verdict.notes.append(f"session {session}: acknowledged turn ending at {end} "
                                 f"lost without a report (restored {res.num_blocks})")
    return int(res.num_blocks)


def disk_bytes(root: Path) -> tuple[int, int]:
    """(bytes allocated on disk, session files) under ``root``."""
    total = files = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            try:
                st = os.stat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue  # deleted meanwhile (a store serving while we look)
            total += st.st_blocks * 512
            files += name.endswith(".fcs")
    return total, files
