"""Placement signals, derived once: session, turn, previous reply, live shared refcount.

Placement needs, before a turn is written, which session it belongs to, its turn
number, the previous reply's length, and how many live requests share its blocks.
An engine knows none of these, so its host derives them here: the vLLM connector's
scheduler side, the SGLang backend (a stored batch of pages is a turn; its
``prefix_keys`` are the history), the replay's FlatCake system, and any caller that
fills the store's ``TurnSignals`` (pure: no I/O, no engine).

Which session a request belongs to:

1. ``kv_transfer_params["session_id"]`` when the client sends it (recommended);
2. otherwise, with ``infer_sessions`` on, the session that owns the last block of the
   request's longest stored prefix. The request *continues* it when it extends the
   session's history: it covers the whole prompt of the session's latest turn (a
   session known to this process), or it reaches the session's newest segment (a
   session recovered from disk after a restart, whose prompts are not known);
3. a request that shares only part of that history is a *branch* (the same history
   with another question, a retry, a sub-agent, another user behind a shared system
   prompt): it stops inside a turn's prompt, or after an older turn than the latest.
   Its tail joins the same session as a later turn, appended to the same file, while
   the branch tails the session took stay under ``max_branch_blocks``
   (``placement.branch_tail_tokens``); past it, the session's branches go to its heir,
   a new session with the same cap, and so on. A session the client named takes no
   branch (its turns and replies stay the client's): its branches go to its heir;
4. a request that covers a whole branch turn is that branch's conversation going on:
   it starts a session of its own (its turn index and previous reply follow the
   branch), so the conversations behind a shared prompt each get their file after
   their first turn;
5. otherwise (no stored prefix) a new session with a generated id (``auto-<hex>``).

A host that stores a request in parts (``turns_in_parts``: SGLang backs up a request's
prompt and then its reply, or its prefill chunks, as separate batches, and its storage
calls name no request) cannot tell a branch's reply from the branch's conversation going
on: both start exactly where the branch's last store ended. There such a store stays
with the branch, as more of its tail (rule 3, so under the same cap), instead of rule 4.

Which turn a hit ends in comes from the books (``HitOwner.hit_turn``); the tracker
remembers where each recent turn's prompt ended. When it does not (an evicted or
recovered session) it falls back to the session's latest turn, as in rule 2.

Why branches join the owner: a working-set prompt asked with rotating questions, or a
conversation retried, then costs one session file, not a new file (header sync,
rename, directory sync) for every one-block tail, and a restore of a branch reads its
history's segments plus its own tail from one file: ``layers x (turns + 1)`` commands at
most. Why capped: unrelated users behind one long system prompt would otherwise merge
into one ever-growing session, which reclaim could only drop whole and which a hot
prompt keeps young forever; the cap bounds both to ``branch_tail_tokens`` of tails.
A branch that stops inside a turn is placed without a previous reply (DEFAULT or
AGENT_CONTEXT: SSD, as its first-turn placement was); one after a whole turn with that
turn's reply.

Single-threaded: the host that derives the signals owns both classes.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flatcake.config import PlacementConfig
from flatcake.control.index import PrefixHit
from flatcake.control.sessions import check_session_id
from flatcake.geometry import KVGeometry

if TYPE_CHECKING:
    from flatcake.control.plane import ControlPlane


def max_branch_blocks(placement: PlacementConfig, geometry: KVGeometry) -> int:
    """``SessionTracker``'s cap: ``placement.branch_tail_tokens`` in whole blocks."""
    return placement.branch_tail_tokens // geometry.tokens_per_block


def _random_session_id() -> str:
    return f"auto-{secrets.token_hex(8)}"  # 64 random bits (no UUID built)


@dataclass(frozen=True, slots=True)
class TurnInfo:
    """The session turn a request is.

    Attributes:
        session_id: the session.
        turn_index: the session's turn, 0 for the first.
        prev_reply_tokens: tokens of the session's previous reply; ``None`` on the first
            turn or when unknown (e.g. a session recovered after a restart).
        inferred: the session was inferred (no ``session_id`` was sent).
        branch_point: for a branch (rule 3), the blocks of the stored history it shares;
            ``None`` for a turn that continues its session or starts one.
    """

    session_id: str
    turn_index: int
    prev_reply_tokens: int | None
    inferred: bool
    branch_point: int | None = None


@dataclass(frozen=True, slots=True)
class _TurnEnd:
    """What one finished turn left: where its prompt ended, its reply, and whether it
    was a branch."""

    prompt_blocks: int
    reply_tokens: int | None
    branch: bool


MAX_TURNS_KEPT = 256  # finished turns a session remembers (newest); older ones fall back


@dataclass(slots=True)
class _SessionState:
    """What a session's finished turns left for the next (mutable, owned by the
    tracker)."""

    num_turns: int
    last_reply_tokens: int | None
    last_prompt_blocks: int
    explicit: bool = False  # the client named it (``session_id``): it takes no branch
    branch_blocks: int = 0  # blocks of branch tails the session took
    heir: str | None = None  # where its branches go once ``branch_blocks`` is at the cap
    turns: dict[int, _TurnEnd] = field(default_factory=dict)  # by turn index


@dataclass(frozen=True, slots=True)
class HitOwner:
    """Who owns the end of a request's stored prefix.

    Attributes:
        session_id: the session owning the last hit block.
        reaches_newest_segment: the hit ends inside that session's newest segment.
        recovered_turns: turns the store holds for the session (newest turn index + 1).
        hit_turn: the turn that wrote the segment holding the last hit block (``None``
            when not known).
    """

    session_id: str
    reaches_newest_segment: bool
    recovered_turns: int
    hit_turn: int | None = None


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
    return HitOwner(last.session_id, last.turn_index == newest, newest + 1, last.turn_index)


class SessionTracker:
    """Turn counts, last reply lengths and last prompt sizes of recent sessions.

    Bounded: the ``max_sessions`` most recently used sessions are kept; an evicted
    session that comes back continues from what the store knows (its turn count).
    ``new_session_id`` names a session that starts without an id (default
    ``auto-<random hex>``; the replay passes a counter so runs repeat exactly).
    ``max_branch_blocks``: blocks of branch tails one session takes before its branches
    go to an heir (``placement.branch_tail_tokens`` over the block size; 0: every branch
    starts a session of its own). ``turns_in_parts``: a request's blocks arrive in
    several stores (see the module docstring)."""

    def __init__(self, infer_sessions: bool = True, max_sessions: int = 100_000,
                 new_session_id: Callable[[], str] = _random_session_id,
                 max_branch_blocks: int = 2048, turns_in_parts: bool = False) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        if max_branch_blocks < 0:
            raise ValueError(f"max_branch_blocks must be >= 0, got {max_branch_blocks}")
        self.infer_sessions = infer_sessions
        self.max_sessions = max_sessions
        self.max_branch_blocks = max_branch_blocks
        self.turns_in_parts = turns_in_parts
        self._new_session_id = new_session_id
        self._sessions: OrderedDict[str, _SessionState] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def resolve(self, explicit: object, num_hit_blocks: int,
                owner: HitOwner | None, prefix: str = "") -> TurnInfo:
        """The turn a new request is (see the module docstring for the rules).

        ``explicit``: ``kv_transfer_params.get("session_id")`` (``None`` when absent);
        ``num_hit_blocks``: length of its stored prefix; ``owner``: who owns its end;
        ``prefix``: of the sessions it starts (a node service's tenant's namespace).
        """
        if explicit is not None:
            sid = check_session_id(explicit, "kv_transfer_params.session_id")
            recovered = owner.recovered_turns if owner and owner.session_id == sid else 0
            return self._turn(sid, recovered, inferred=False)
        if self.infer_sessions and owner is not None and num_hit_blocks > 0:
            state = self._sessions.get(owner.session_id)
            hit_turn = owner.hit_turn
            end = None if state is None or hit_turn is None else state.turns.get(hit_turn)
            if state is not None and hit_turn is not None and end is not None:
                # The turn whose blocks the hit ends in is known here.
                if num_hit_blocks < end.prompt_blocks:
                    return self._branch(owner, num_hit_blocks, prefix)
                if end.branch and self.turns_in_parts and \
                        num_hit_blocks == end.prompt_blocks:  # the branch's next part
                    return self._branch(owner, num_hit_blocks, prefix, end.reply_tokens)
                if end.branch:  # a branch goes on: its conversation gets its own session
                    return TurnInfo(prefix + self._new_session_id(), hit_turn + 1,
                                    end.reply_tokens, True)
                if hit_turn < max(state.turns):  # after an older turn: a branch
                    return self._branch(owner, num_hit_blocks, prefix, end.reply_tokens)
                return self._turn(owner.session_id, owner.recovered_turns, True,
                                  end.reply_tokens)
            if state is not None:
                extends = num_hit_blocks >= state.last_prompt_blocks
            else:
                extends = owner.reaches_newest_segment
            if extends:
                return self._turn(owner.session_id, owner.recovered_turns, inferred=True)
            return self._branch(owner, num_hit_blocks, prefix)
        return TurnInfo(prefix + self._new_session_id(), 0, None, True)

    def _branch(self, owner: HitOwner, num_hit_blocks: int, prefix: str,
                prev_reply_tokens: int | None = None) -> TurnInfo:
        """A branch of ``owner``'s session: the first session along its heirs whose
        branch tails are under the cap (a new heir when the last one is full)."""
        sid, state = owner.session_id, self._sessions.get(owner.session_id)
        while state is not None and (state.explicit
                                     or state.branch_blocks >= self.max_branch_blocks):
            if state.heir is None:
                state.heir = prefix + self._new_session_id()
            sid, state = state.heir, self._sessions.get(state.heir)
        recovered = owner.recovered_turns if sid == owner.session_id else 0
        turn_index = recovered if state is None else max(state.num_turns, recovered)
        if state is not None:
            # Branches in flight at once get turns of their own (their ends differ).
            state.num_turns = turn_index + 1
            self._sessions.move_to_end(sid)
        return TurnInfo(sid, turn_index, prev_reply_tokens, True, num_hit_blocks)

    def _turn(self, sid: str, recovered_turns: int, inferred: bool,
              prev_reply_tokens: int | None = None) -> TurnInfo:
        state = self._sessions.get(sid)
        if state is None:
            return TurnInfo(sid, recovered_turns, prev_reply_tokens, inferred)
        self._sessions.move_to_end(sid)
        reply = state.last_reply_tokens if prev_reply_tokens is None else prev_reply_tokens
        return TurnInfo(sid, max(state.num_turns, recovered_turns), reply, inferred)

    def finish_turn(self, turn: TurnInfo, reply_tokens: int | None,
                    prompt_blocks: int) -> None:
        """Record a finished turn: the next turn of the session gets ``turn_index + 1``
        and ``prev_reply_tokens = reply_tokens`` (``None``: not known, as for SGLang,
        whose storage calls carry no request)."""
        if (reply_tokens is not None and reply_tokens < 0) or prompt_blocks < 0:
            raise ValueError(f"reply_tokens and prompt_blocks must be >= 0, got "
                             f"{reply_tokens}, {prompt_blocks}")
        state = self._sessions.get(turn.session_id)
        num_turns = turn.turn_index + 1
        branch = turn.branch_point is not None
        if state is None:
            state = self._sessions[turn.session_id] = _SessionState(
                num_turns, reply_tokens, prompt_blocks, not turn.inferred)
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        else:
            state.explicit |= not turn.inferred
            state.num_turns = max(state.num_turns, num_turns)
            if not branch:  # the session's own line; a branch follows another turn
                state.last_reply_tokens = reply_tokens
                state.last_prompt_blocks = prompt_blocks
            self._sessions.move_to_end(turn.session_id)
        if branch:
            state.branch_blocks += max(prompt_blocks - (turn.branch_point or 0), 0)
        state.turns[turn.turn_index] = _TurnEnd(prompt_blocks, reply_tokens, branch)
        if len(state.turns) > MAX_TURNS_KEPT:
            del state.turns[next(iter(state.turns))]

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
