"""Placement signals, derived once: session, turn, previous reply, live shared refcount.

Placement needs, before a turn is written, which session it belongs to, its turn
number, the previous reply's length, and how many live requests share its blocks.
An engine knows none of these, so its host derives them here: the vLLM connector's
scheduler side, the replay's FlatCake system, and any caller that fills the store's
``TurnSignals`` (pure: no I/O, no engine).

Which session a request belongs to:

1. ``kv_transfer_params["session_id"]`` when the client sends it (recommended);
2. otherwise, with ``infer_sessions`` on, the session that owns the last block of the
   request's longest stored prefix, *if* the request extends that session's history:
   it covers the whole prompt of the session's latest turn (a session known to this
   process), or it reaches the session's newest segment (a session recovered from
   disk after a restart, whose prompts are not known). A request that shares only an
   older part of a session (a common system prompt, a branch) starts a new session;
3. otherwise a new session with a generated id (``auto-<hex>``).

Single-threaded: the host that derives the signals owns both classes.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flatcake.control.index import PrefixHit
from flatcake.control.sessions import check_session_id

if TYPE_CHECKING:
    from flatcake.control.plane import ControlPlane


def _random_session_id() -> str:
    return f"auto-{uuid.uuid4().hex[:16]}"


@dataclass(frozen=True, slots=True)
class TurnInfo:
    """The session turn a request is.

    Attributes:
        session_id: the session.
        turn_index: the session's turn, 0 for the first.
        prev_reply_tokens: tokens of the session's previous reply; ``None`` on the first
            turn or when unknown (e.g. a session recovered after a restart).
        inferred: the session was inferred (no ``session_id`` was sent).
    """

    session_id: str
    turn_index: int
    prev_reply_tokens: int | None
    inferred: bool


@dataclass(slots=True)
class _SessionState:
    """What one finished turn left for the next (mutable, owned by the tracker)."""

    num_turns: int
    last_reply_tokens: int | None
    last_prompt_blocks: int


@dataclass(frozen=True, slots=True)
class HitOwner:
    """Who owns the end of a request's stored prefix.

    Attributes:
        session_id: the session owning the last hit block.
        reaches_newest_segment: the hit ends inside that session's newest segment.
        recovered_turns: turns the store holds for the session (newest turn index + 1).
    """

    session_id: str
    reaches_newest_segment: bool
    recovered_turns: int


def hit_owner(control: ControlPlane, hit: PrefixHit) -> HitOwner | None:
    """Who owns the end of ``hit`` in ``control``'s books (``None`` for an empty hit or
    a session the books no longer hold)."""
    if not hit.runs:
        return None
    last = hit.runs[-1].segment
    try:
        newest = control.newest_turn_index(last.session_id)
    except KeyError:
        return None
    return HitOwner(last.session_id, last.turn_index == newest, newest + 1)


class SessionTracker:
    """Turn counts, last reply lengths and last prompt sizes of recent sessions.

    Bounded: the ``max_sessions`` most recently used sessions are kept; an evicted
    session that comes back continues from what the store knows (its turn count).
    ``new_session_id`` names a session that starts without an id (default
    ``auto-<random hex>``; the replay passes a counter so runs repeat exactly)."""

    def __init__(self, infer_sessions: bool = True, max_sessions: int = 100_000,
                 new_session_id: Callable[[], str] = _random_session_id) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.infer_sessions = infer_sessions
        self.max_sessions = max_sessions
        self._new_session_id = new_session_id
        self._sessions: OrderedDict[str, _SessionState] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def resolve(self, explicit: object, num_hit_blocks: int,
                owner: HitOwner | None) -> TurnInfo:
        """The turn a new request is (see the module docstring for the rules).

        ``explicit``: ``kv_transfer_params.get("session_id")`` (``None`` when absent);
        ``num_hit_blocks``: length of its stored prefix; ``owner``: who owns its end.
        """
        if explicit is not None:
            sid = check_session_id(explicit, "kv_transfer_params.session_id")
            recovered = owner.recovered_turns if owner and owner.session_id == sid else 0
            return self._turn(sid, recovered, inferred=False)
        if self.infer_sessions and owner is not None and num_hit_blocks > 0:
            state = self._sessions.get(owner.session_id)
            if state is not None:
                extends = num_hit_blocks >= state.last_prompt_blocks
            else:
                extends = owner.reaches_newest_segment
            if extends:
                return self._turn(owner.session_id, owner.recovered_turns, inferred=True)
        return TurnInfo(self._new_session_id(), 0, None, True)

    def _turn(self, sid: str, recovered_turns: int, inferred: bool) -> TurnInfo:
        state = self._sessions.get(sid)
        if state is None:
            return TurnInfo(sid, recovered_turns, None, inferred)
        self._sessions.move_to_end(sid)
        return TurnInfo(sid, max(state.num_turns, recovered_turns), state.last_reply_tokens,
                        inferred)

    def finish_turn(self, turn: TurnInfo, reply_tokens: int, prompt_blocks: int) -> None:
        """Record a finished turn: the next turn of the session gets ``turn_index + 1``
        and ``prev_reply_tokens = reply_tokens``."""
        if reply_tokens < 0 or prompt_blocks < 0:
            raise ValueError(f"reply_tokens and prompt_blocks must be >= 0, got "
                             f"{reply_tokens}, {prompt_blocks}")
        state = self._sessions.get(turn.session_id)
        num_turns = turn.turn_index + 1
        if state is None:
            self._sessions[turn.session_id] = _SessionState(num_turns, reply_tokens,
                                                            prompt_blocks)
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        else:
            state.num_turns = max(state.num_turns, num_turns)
            state.last_reply_tokens = reply_tokens
            state.last_prompt_blocks = prompt_blocks
            self._sessions.move_to_end(turn.session_id)

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)


class PrefixRefcount:
    """How many live requests hold each block key (the prefix-tree refcount).

    Keys are chained prefix hashes, so a key names its position in every request that
    holds it: ``refcount(key, position)`` checks one key per live request. Adding and
    removing a request cost O(1) however long its prompt (its keys are kept as given);
    a count is asked once per stored turn."""

    def __init__(self) -> None:
        self._held: dict[Hashable, tuple[bytes, ...]] = {}

    def __len__(self) -> int:
        """Distinct keys held."""
        return len(frozenset().union(*self._held.values()))

    def add(self, request_id: Hashable, keys: Sequence[bytes]) -> None:
        """Count ``keys`` for ``request_id`` (again: replaces its earlier keys)."""
        self._held[request_id] = tuple(keys)

    def remove(self, request_id: Hashable) -> None:
        self._held.pop(request_id, None)

    def holds(self, request_id: Hashable) -> bool:
        return request_id in self._held

    def refcount(self, key: bytes, position: int | None = None) -> int:
        """Live requests holding ``key``; ``position``, its index in the request's keys
        (when known), turns each request's search into one comparison."""
        if position is None:
            return sum(key in held for held in self._held.values())
        if position < 0:
            raise ValueError(f"position must be >= 0, got {position}")
        return sum(len(held) > position and held[position] == key
                   for held in self._held.values())
