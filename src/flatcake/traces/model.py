"""The in-memory trace model every reader fills and every consumer reads.

A trace is a table of requests held as numpy columns, plus one flat array of block
hashes shared by all requests. Nothing is stored per block as a Python object, so the
whole Claude Code trace (37,770 requests, 71.4 M block accesses) is about 0.6 GB and a
replay can walk it at numpy speed::

    request i ──► block_hashes[block_offsets[i] : block_offsets[i + 1]]

    block_offsets  (num_requests + 1,) int64   0 = o0 <= o1 <= ... <= oR = num_block_accesses
    block_hashes   (num_block_accesses,) int64 chained prefix-block ids, request by request

Request order. For a ``global`` clock trace, requests are in arrival order (ties keep
file order) and ``time_s`` is seconds since the first request. For a ``session`` clock
trace there is no global order: requests are grouped by session (sessions in file
order) and sorted by ``time_s`` inside each session, where ``time_s`` is seconds since
the session started; a replay chooses the session start times. In both cases
``requests_of_session(s)`` lists session ``s``'s requests in time order.

Block ids. ``block_hashes`` holds one id per ``block_size_tokens`` tokens of the
request's input, chained (id k stands for the whole prefix of blocks 0..k), so two
requests sharing an id share the whole prefix up to it. Ids are unique across the trace:
readers of formats whose ids are numbered per session (the Claude Code format,
``hash_id_scope: "local"``) namespace them as ``session << SESSION_SHIFT | local_id``,
so sessions never collide, while sub-agents keep their parent's namespace as the format
specifies. ``partial_last_block`` says whether the last, partial block of a request is
hashed (Mooncake: ``ceil(input/512)`` ids) or dropped (Claude Code: ``floor(input/64)``).
A trace without hashes (``has_hashes`` False, the Azure length-only CSVs) has all
offsets 0 and drives arrivals and lengths only.

Sessions and agents. ``session`` is the session index (``-1`` when the format has no
sessions) into ``session_names``; ``agent`` is 0 for the main agent and ``k >= 1`` for
the k-th sub-agent spawned in that session (``subagents`` holds their metadata);
``turn`` counts the requests of one (session, agent) in time order, from 0. Unknown
numbers are ``-1`` (ints) or NaN (floats).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

SESSION_SHIFT = 40
"""Per-session block ids are namespaced as ``session << SESSION_SHIFT | local_id``."""

MAX_LOCAL_BLOCK_ID = (1 << SESSION_SHIFT) - 1
MAX_SESSIONS = 1 << (63 - SESSION_SHIFT)

Clock = Literal["global", "session"]
CLOCKS: tuple[str, ...] = ("global", "session")


@dataclass(frozen=True, slots=True)
class SubAgent:
    """One sub-agent of a session (Claude Code ``"subagent"`` entries).

    Attributes:
        session: index of the session it belongs to.
        agent: its agent index inside the session (``>= 1``).
        parent_agent: agent index of the agent that spawned it (0 = main agent).
        spawn_time_s: spawn time on the session clock; its requests' ``time_s`` are
            this plus their own relative time.
        name: the format's agent id ("" when unknown).
        kind: the format's sub-agent type ("" when unknown).
    """

    session: int
    agent: int
    parent_agent: int
    spawn_time_s: float
    name: str = ""
    kind: str = ""


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """A request trace as numpy columns; see the module docstring for the layout.

    Per-request columns (length ``num_requests``):
        time_s: float64 arrival time in seconds (global or per-session clock).
        session: int32 session index, -1 without sessions.
        agent: int32, 0 = main agent, k >= 1 = k-th sub-agent of the session.
        turn: int32 index of the request within its (session, agent), -1 without sessions.
        input_tokens / output_tokens: int64 token counts.
        think_time_s: float64 client delay before the request (NaN when unknown).

    Hash columns: ``block_offsets`` (num_requests + 1) and ``block_hashes``.

    Per-session columns (length ``num_sessions``): ``session_names`` and
    ``session_prefix_tokens`` (the tools + system prompt tokens the format reports,
    -1 when unknown).

    Metadata: ``name`` (file name or generator label), ``source_format``,
    ``block_size_tokens``, ``clock``, ``has_hashes``, ``partial_last_block``,
    ``subagents``, ``start_unix_s`` (wall time of ``time_s == 0`` when the format
    gives one), ``num_skipped_lines`` / ``skipped_examples`` (lines dropped by
    ``skip_bad``; never dropped silently).
    """

    name: str
    source_format: str
    block_size_tokens: int
    clock: Clock
    has_hashes: bool
    partial_last_block: bool
    time_s: np.ndarray
    session: np.ndarray
    agent: np.ndarray
    turn: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    think_time_s: np.ndarray
    block_offsets: np.ndarray
    block_hashes: np.ndarray
    session_names: tuple[str, ...] = ()
    session_prefix_tokens: np.ndarray = field(
        default_factory=lambda: np.zeros(0, dtype=np.int64))
    subagents: tuple[SubAgent, ...] = ()
    start_unix_s: float | None = None
    num_skipped_lines: int = 0
    skipped_examples: tuple[str, ...] = ()
    _session_order: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64),
                                       repr=False)
    _session_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64),
                                         repr=False)

    def __post_init__(self) -> None:
        n = int(self.time_s.shape[0])
        if self.block_size_tokens <= 0:
            raise ValueError(f"Trace.block_size_tokens must be > 0, got {self.block_size_tokens}")
        if self.clock not in CLOCKS:
            raise ValueError(f"Trace.clock must be one of {CLOCKS}, got {self.clock!r}")
        for name in ("session", "agent", "turn", "input_tokens", "output_tokens",
                     "think_time_s"):
            col = getattr(self, name)
            if col.shape != (n,):
                raise ValueError(f"Trace.{name} has shape {col.shape}, expected ({n},)")
        if self.block_offsets.shape != (n + 1,):
            raise ValueError(
                f"Trace.block_offsets has shape {self.block_offsets.shape}, expected ({n + 1},)")
        if int(self.block_offsets[0]) != 0 or int(self.block_offsets[-1]) != len(
                self.block_hashes):
            raise ValueError("Trace.block_offsets must start at 0 and end at len(block_hashes)")
        if len(self.session_prefix_tokens) != len(self.session_names):
            raise ValueError("Trace.session_prefix_tokens must have one entry per session")
        if n and len(self.session_names) and int(self.session.max()) >= len(self.session_names):
            raise ValueError("Trace.session holds an index beyond session_names")
        if len(self.session_names) and len(self._session_order) != int((self.session >= 0).sum()):
            # Index every session's requests once, in time order (stable for ties).
            sel = np.flatnonzero(self.session >= 0)
            order = sel[np.argsort(self.session[sel], kind="stable")]
            counts = np.bincount(self.session[sel], minlength=len(self.session_names))
            offsets = np.zeros(len(self.session_names) + 1, dtype=np.int64)
            np.cumsum(counts, out=offsets[1:])
            object.__setattr__(self, "_session_order", order.astype(np.int64))
            object.__setattr__(self, "_session_offsets", offsets)

    # ------------------------------------------------------------------ sizes
    @property
    def num_requests(self) -> int:
        return int(self.time_s.shape[0])

    @property
    def num_sessions(self) -> int:
        return len(self.session_names)

    @property
    def num_block_accesses(self) -> int:
        return int(self.block_hashes.shape[0])

    @property
    def num_blocks(self) -> np.ndarray:
        """Blocks per request, int64 ``(num_requests,)``."""
        return np.diff(self.block_offsets)

    # ----------------------------------------------------------------- access
    def blocks(self, i: int) -> np.ndarray:
        """Block ids of request ``i`` (a view, do not modify)."""
        return self.block_hashes[self.block_offsets[i]:self.block_offsets[i + 1]]

    def requests_of_session(self, s: int) -> np.ndarray:
        """Request indices of session ``s`` in time order (int64 array)."""
        if not 0 <= s < self.num_sessions:
            raise ValueError(f"session index {s} out of range [0, {self.num_sessions})")
        return self._session_order[self._session_offsets[s]:self._session_offsets[s + 1]]

    @property
    def session_sizes(self) -> np.ndarray:
        """Requests per session, int64 ``(num_sessions,)``."""
        return np.diff(self._session_offsets)

    def request_of_access(self) -> np.ndarray:
        """For each block access, the index of its request, int64 ``(num_block_accesses,)``."""
        return np.repeat(np.arange(self.num_requests, dtype=np.int64), self.num_blocks)

    def time_span_s(self) -> float:
        """Last minus first arrival (global clock) or the longest session (session clock)."""
        if not self.num_requests:
            return 0.0
        return float(np.nanmax(self.time_s) - np.nanmin(self.time_s))

    def summary(self) -> str:
        hashes = (f"{self.num_block_accesses} block accesses of {self.block_size_tokens} tokens"
                  if self.has_hashes else "no block hashes (lengths only)")
        sessions = f", {self.num_sessions} sessions" if self.num_sessions else ""
        return (f"{self.name} [{self.source_format}]: {self.num_requests} requests{sessions}, "
                f"{hashes}, {self.clock} clock")


def build_trace(
    *,
    name: str,
    source_format: str,
    block_size_tokens: int,
    clock: Clock,
    has_hashes: bool,
    partial_last_block: bool,
    time_s: Sequence[float] | np.ndarray,
    input_tokens: Sequence[int] | np.ndarray,
    output_tokens: Sequence[int] | np.ndarray,
    block_counts: Sequence[int] | np.ndarray,
    block_hashes: np.ndarray,
    session: Sequence[int] | np.ndarray | None = None,
    agent: Sequence[int] | np.ndarray | None = None,
    think_time_s: Sequence[float] | np.ndarray | None = None,
    session_names: Sequence[str] = (),
    session_prefix_tokens: Sequence[int] | np.ndarray | None = None,
    subagents: Sequence[SubAgent] = (),
    start_unix_s: float | None = None,
    num_skipped_lines: int = 0,
    skipped_examples: Sequence[str] = (),
    turn: Sequence[int] | np.ndarray | None = None,
) -> Trace:
    """Assemble a :class:`Trace` from columns already in model order.

    ``turn`` is derived (request rank inside its (session, agent)) when not given.
    """
    n = len(time_s)
    counts = np.asarray(block_counts, dtype=np.int64)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    sess = (np.full(n, -1, dtype=np.int32) if session is None
            else np.asarray(session, dtype=np.int32))
    ag = np.zeros(n, dtype=np.int32) if agent is None else np.asarray(agent, dtype=np.int32)
    think = (np.full(n, np.nan) if think_time_s is None
             else np.asarray(think_time_s, dtype=np.float64))
    prefix = (np.full(len(session_names), -1, dtype=np.int64) if session_prefix_tokens is None
              else np.asarray(session_prefix_tokens, dtype=np.int64))
    turns = _turns(sess, ag) if turn is None else np.asarray(turn, dtype=np.int32)
    return Trace(
        name=name,
        source_format=source_format,
        block_size_tokens=block_size_tokens,
        clock=clock,
        has_hashes=has_hashes,
        partial_last_block=partial_last_block,
        time_s=np.asarray(time_s, dtype=np.float64),
        session=sess,
        agent=ag,
        turn=turns,
        input_tokens=np.asarray(input_tokens, dtype=np.int64),
        output_tokens=np.asarray(output_tokens, dtype=np.int64),
        think_time_s=think,
        block_offsets=offsets,
        block_hashes=np.asarray(block_hashes, dtype=np.int64),
        session_names=tuple(session_names),
        session_prefix_tokens=prefix,
        subagents=tuple(subagents),
        start_unix_s=start_unix_s,
        num_skipped_lines=num_skipped_lines,
        skipped_examples=tuple(skipped_examples),
    )


def _turns(session: np.ndarray, agent: np.ndarray) -> np.ndarray:
    """Rank of each request inside its (session, agent) in current order; -1 without session."""
    n = len(session)
    turns = np.full(n, -1, dtype=np.int32)
    sel = np.flatnonzero(session >= 0)
    if not len(sel):
        return turns
    key = session[sel].astype(np.int64) * (int(agent.max(initial=0)) + 1) + agent[sel]
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    starts = np.r_[True, sorted_key[1:] != sorted_key[:-1]]
    idx = np.arange(len(order))
    run_start = np.maximum.accumulate(np.where(starts, idx, 0))
    turns[sel[order]] = (idx - run_start).astype(np.int32)
    return turns
