"""Reclaim choice (FC-GVA): which whole sessions to drop. Pure.

Blocks never change, so reclaim never writes anything back and never migrates: when a
medium's use crosses its high watermark, whole sessions are dropped, oldest last access
first, skipping sessions pinned by an active restore (or an in-flight write), until use
is at or under the low watermark. SSD and host memory are chosen by separate calls,
each with that medium's bytes per session.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SessionUsage:
    """What reclaim needs to know about one session, for one medium.

    Attributes:
        session_id: the session.
        last_access: clock time of its last access (older goes first).
        pinned: a restore is reading it or a write into it is in flight.
        bytes: bytes it holds on the medium being reclaimed.
    """

    session_id: str
    last_access: float
    pinned: bool
    bytes: int


def needs_reclaim(used_bytes: int, capacity_bytes: int, high: float) -> bool:
    """True when use is over the high watermark."""
    return used_bytes > high * capacity_bytes


def choose_victims(
    sessions: Iterable[SessionUsage],
    used_bytes: int,
    capacity_bytes: int,
    high: float,
    low: float,
) -> list[str]:
    """Sessions to drop, in drop order.

    Nothing when ``used_bytes <= high * capacity_bytes``. Otherwise unpinned sessions
    holding bytes on the medium, oldest ``last_access`` first (ties by session id, so
    the choice is deterministic), until ``used_bytes`` minus their bytes is at or under
    ``low * capacity_bytes``. If every unpinned session goes and use is still above the
    low watermark, all of them are returned; the caller's hard budget then decides.
    """
    if not 0.0 <= low < high:
        raise ValueError(f"reclaim watermarks must satisfy 0 <= low < high, got "
                         f"low={low!r} high={high!r}")
    if not needs_reclaim(used_bytes, capacity_bytes, high):
        return []
    target = low * capacity_bytes
    candidates = sorted(
        (s for s in sessions if not s.pinned and s.bytes > 0),
        key=lambda s: (s.last_access, s.session_id),
    )
    victims: list[str] = []
    remaining = used_bytes
    for s in candidates:
        if remaining <= target:
            break
        victims.append(s.session_id)
        remaining -= s.bytes
    return victims
