"""A trace in replay form: per-request numpy columns and each request's blocks as *runs*
of dense block ids.

The trace toolkit (``flatcake.traces``) hands over one int64 id per block access (71.4 M
for the Claude Code trace). The simulator never needs them one by one: chained prefix
ids come in long consecutive stretches (a turn re-reads the previous turn's ids and
appends new ones), so each request is stored as a few ``(start, length)`` runs over
*dense* ids ``[0, num_ids)``. The Claude Code trace becomes 128 K runs (3.4 per request)
and a handful of MB; a request's id array is rebuilt on demand in microseconds.

Replay chains. A *chain* is the sequence of requests one client issues one after the
other: a (session, agent) pair for session traces (the main agent and each sub-agent of
a session are separate chains in the same block namespace). A chain's next request is
sent ``think_s`` after the previous reply. Global-clock traces have no chains: each
request arrives at its recorded time, scaled to the requested rate.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flatcake.replay.workload.types import FloatArray, IdArray, IntArray

logger = logging.getLogger(__name__)

_CACHE_VERSION = 1


@dataclass(frozen=True, slots=True, eq=False)
class Workload:
    """Requests of a trace, ready to replay.

    Per request (``num_requests``): ``time_s`` (recorded arrival: global clock, or the
    session clock), ``session`` (-1 without sessions), ``chain`` (-1 for global-clock
    traces), ``turn`` (index in its chain), ``input_tokens``, ``output_tokens``,
    ``think_s`` (delay after the chain's previous reply; 0 for a chain's first request),
    and ``run_ptr`` (``num_requests + 1``) into ``run_start``/``run_len``.

    Per chain (``num_chains``): ``chain_ptr`` into ``chain_req`` (its requests in order),
    ``chain_session`` and ``chain_offset_s`` (when the chain starts after its session
    starts: 0 for the main agent, the spawn time for a sub-agent).
    """

    name: str
    block_tokens: int
    num_ids: int
    global_clock: bool
    num_sessions: int
    time_s: FloatArray
    session: np.ndarray
    chain: np.ndarray
    turn: np.ndarray
    input_tokens: IntArray
    output_tokens: IntArray
    think_s: FloatArray
    run_ptr: IntArray
    run_start: np.ndarray
    run_len: np.ndarray
    chain_ptr: IntArray
    chain_req: IntArray
    chain_session: np.ndarray
    chain_offset_s: FloatArray

    def __post_init__(self) -> None:
        n = len(self.time_s)
        if self.block_tokens <= 0:
            raise ValueError(f"Workload.block_tokens must be > 0, got {self.block_tokens}")
        for name in ("session", "chain", "turn", "input_tokens", "output_tokens", "think_s"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Workload.{name} has {len(getattr(self, name))} entries, "
                                 f"expected {n}")
        if len(self.run_ptr) != n + 1:
            raise ValueError(f"Workload.run_ptr has {len(self.run_ptr)} entries, expected {n + 1}")
        if self.num_ids >= 2**31:
            raise ValueError(f"Workload.num_ids={self.num_ids} does not fit int32 ids")
        if (self.input_tokens < 0).any() or (self.output_tokens < 0).any():
            raise ValueError("Workload token counts must be >= 0")

    # ---- sizes -------------------------------------------------------------------
    @property
    def num_requests(self) -> int:
        return len(self.time_s)

    @property
    def num_chains(self) -> int:
        return len(self.chain_session)

    @property
    def num_runs(self) -> int:
        return len(self.run_start)

    def blocks_per_request(self) -> IntArray:
        """Blocks of each request (int64)."""
        lens = self.run_len.astype(np.int64)
        csum = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=csum[1:])
        return csum[self.run_ptr[1:]] - csum[self.run_ptr[:-1]]

    @property
    def num_block_accesses(self) -> int:
        return int(self.run_len.astype(np.int64).sum())

    def requests_of_chain(self, c: int) -> IntArray:
        return self.chain_req[self.chain_ptr[c]:self.chain_ptr[c + 1]]

    # ---- blocks ------------------------------------------------------------------
    def blocks(self, i: int) -> IdArray:
        """Dense block ids of request ``i``, in prefix order (a new int32 array)."""
        a, b = int(self.run_ptr[i]), int(self.run_ptr[i + 1])
        if b - a == 1:
            s = int(self.run_start[a])
            return np.arange(s, s + int(self.run_len[a]), dtype=np.int32)
        if a == b:
            return np.zeros(0, dtype=np.int32)
        return expand_runs(self.run_start[a:b], self.run_len[a:b])

    def runs(self, i: int) -> tuple[tuple[int, int], ...]:
        """Request ``i``'s blocks as half-open id ranges, in prefix order."""
        a, b = int(self.run_ptr[i]), int(self.run_ptr[i + 1])
        starts = self.run_start[a:b].tolist()
        lens = self.run_len[a:b].tolist()
        return tuple((s, s + n) for s, n in zip(starts, lens, strict=True))

    def summary(self) -> str:
        kind = "global clock" if self.global_clock else f"{self.num_sessions} sessions"
        return (f"{self.name}: {self.num_requests} requests ({kind}, {self.num_chains} chains), "
                f"{self.num_block_accesses} block accesses of {self.block_tokens} tokens over "
                f"{self.num_ids} distinct blocks, {self.num_runs} runs")

    # ---- cache -------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write the workload as an ``.npz`` (loads back with ``Workload.load``)."""
        arrays = {name: getattr(self, name) for name in _ARRAY_FIELDS}
        meta = np.array([_CACHE_VERSION, self.block_tokens, self.num_ids,
                         int(self.global_clock), self.num_sessions], dtype=np.int64)
        np.savez(path, meta=meta, name=np.array(self.name), **arrays)

    @classmethod
    def load(cls, path: str | Path) -> Workload:
        with np.load(path, allow_pickle=False) as z:
            meta = z["meta"]
            if int(meta[0]) != _CACHE_VERSION:
                raise ValueError(f"{path}: workload cache version {int(meta[0])}, "
                                 f"expected {_CACHE_VERSION}")
            arrays = {name: z[name] for name in _ARRAY_FIELDS}
            return cls(name=str(z["name"]), block_tokens=int(meta[1]), num_ids=int(meta[2]),
                       global_clock=bool(meta[3]), num_sessions=int(meta[4]), **arrays)


_ARRAY_FIELDS = ("time_s", "session", "chain", "turn", "input_tokens", "output_tokens",
                 "think_s", "run_ptr", "run_start", "run_len", "chain_ptr", "chain_req",
                 "chain_session", "chain_offset_s")


def expand_runs(starts: np.ndarray, lens: np.ndarray) -> IdArray:
    """Concatenate ``arange(s, s + n)`` for every run, as int32, without a Python loop."""
    lens64 = lens.astype(np.int64)
    total = int(lens64.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int32)
    offs = np.cumsum(lens64) - lens64
    shift = np.repeat(starts.astype(np.int64) - offs, lens64)
    return (np.arange(total, dtype=np.int64) + shift).astype(np.int32)


def dense_runs(block_offsets: np.ndarray, block_hashes: np.ndarray
               ) -> tuple[IntArray, np.ndarray, np.ndarray, int]:
    """Runs over dense ids from per-access chained ids.

    Returns ``(run_ptr, run_start, run_len, num_ids)``: request ``i`` is runs
    ``[run_ptr[i], run_ptr[i+1])``; the same original id always maps to the same dense
    id, and distinct ids to distinct ones, so ``num_ids`` is the number of distinct
    blocks. Works on any int64 ids: a run is a stretch of ids increasing by one inside
    one request; the union of the runs' id intervals is packed end to end.
    """
    h = np.asarray(block_hashes, dtype=np.int64)
    offsets = np.asarray(block_offsets, dtype=np.int64)
    n_acc = len(h)
    if n_acc == 0:
        return (np.zeros(len(offsets), dtype=np.int64), np.zeros(0, dtype=np.int32),
                np.zeros(0, dtype=np.int32), 0)
    brk = np.empty(n_acc, dtype=bool)
    brk[0] = True
    np.not_equal(np.diff(h), 1, out=brk[1:])
    req_starts = offsets[:-1][np.diff(offsets) > 0]
    brk[req_starts] = True
    starts_idx = np.flatnonzero(brk)
    del brk
    lo = h[starts_idx]
    run_len = np.diff(np.append(starts_idx, n_acc))
    run_ptr = np.searchsorted(starts_idx, offsets, side="left").astype(np.int64)
    hi = lo + run_len
    order = np.argsort(lo, kind="stable")
    slo, shi = lo[order], hi[order]
    reach = np.maximum.accumulate(shi)
    new_group = np.ones(len(slo), dtype=bool)
    new_group[1:] = slo[1:] >= reach[:-1]
    gidx = np.flatnonzero(new_group)
    g_lo = slo[gidx]
    g_hi = np.maximum.reduceat(shi, gidx)
    g_len = g_hi - g_lo
    g_base = np.zeros(len(g_len), dtype=np.int64)
    np.cumsum(g_len[:-1], out=g_base[1:])
    gid = np.cumsum(new_group) - 1
    dense_sorted = g_base[gid] + (slo - g_lo[gid])
    dense = np.empty_like(dense_sorted)
    dense[order] = dense_sorted
    num_ids = int(g_len.sum())
    if num_ids >= 2**31:
        raise ValueError(f"trace has {num_ids} distinct blocks; the replay supports < 2**31")
    return run_ptr, dense.astype(np.int32), run_len.astype(np.int32), num_ids


def from_trace(trace: object) -> Workload:
    """Build a workload from a ``flatcake.traces.model.Trace``."""
    t = trace
    name = str(getattr(t, "name", "trace"))
    if not getattr(t, "has_hashes", True):
        raise ValueError(f"trace {name!r} has no block hashes (lengths only): it cannot drive "
                         f"a prefix-cache replay")
    offsets = np.asarray(t.block_offsets, dtype=np.int64)  # type: ignore[attr-defined]
    hashes = np.asarray(t.block_hashes)  # type: ignore[attr-defined]
    run_ptr, run_start, run_len, num_ids = dense_runs(offsets, hashes)
    time_s = np.asarray(t.time_s, dtype=np.float64)  # type: ignore[attr-defined]
    n = len(time_s)
    session = np.asarray(t.session, dtype=np.int32)  # type: ignore[attr-defined]
    agent = np.asarray(t.agent, dtype=np.int32)  # type: ignore[attr-defined]
    think = np.asarray(t.think_time_s, dtype=np.float64)  # type: ignore[attr-defined]
    global_clock = t.clock == "global"  # type: ignore[attr-defined]
    num_sessions = len(t.session_names)  # type: ignore[attr-defined]
    inp = np.asarray(t.input_tokens, dtype=np.int64)  # type: ignore[attr-defined]
    out = np.asarray(t.output_tokens, dtype=np.int64)  # type: ignore[attr-defined]
    block_tokens = int(t.block_size_tokens)  # type: ignore[attr-defined]
    if global_clock or num_sessions == 0:
        return _build(name, block_tokens, num_ids, True, 0, time_s, session,
                      np.full(n, -1, dtype=np.int64), inp, out, think, run_ptr, run_start,
                      run_len)
    chain_key = session.astype(np.int64) * (int(agent.max(initial=0)) + 1) + agent
    return _build(name, block_tokens, num_ids, False, num_sessions, time_s, session,
                  chain_key, inp, out, think, run_ptr, run_start, run_len)


def subset(wl: Workload, keep: np.ndarray, name: str) -> Workload:
    """The requests of ``wl`` where ``keep`` (a bool mask) is set, as a workload of its
    own (sessions renumbered; block ids unchanged)."""
    idx = np.flatnonzero(keep)
    if not len(idx):
        raise ValueError(f"{name}: no requests left after the split")
    a, b = wl.run_ptr[idx], wl.run_ptr[idx + 1]
    lens = (b - a).astype(np.int64)
    run_ptr = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(lens, out=run_ptr[1:])
    take = np.concatenate([np.arange(s, e) for s, e in zip(a, b, strict=True)]) \
        if len(idx) else np.zeros(0, dtype=np.int64)
    if wl.global_clock:
        return _build(name, wl.block_tokens, wl.num_ids, True, 0, wl.time_s[idx],
                      wl.session[idx], np.full(len(idx), -1, dtype=np.int64),
                      wl.input_tokens[idx], wl.output_tokens[idx], wl.think_s[idx], run_ptr,
                      wl.run_start[take], wl.run_len[take])
    sessions, session = np.unique(wl.session[idx], return_inverse=True)
    # Chain keys: (session, chain) pairs stay distinct; think times are kept as recorded.
    chain_key = session.astype(np.int64) * (int(wl.chain.max(initial=0)) + 1) + wl.chain[idx]
    return _build(name, wl.block_tokens, wl.num_ids, False, len(sessions),
                  wl.time_s[idx], session.astype(np.int32), chain_key,
                  wl.input_tokens[idx], wl.output_tokens[idx], wl.think_s[idx], run_ptr,
                  wl.run_start[take], wl.run_len[take])


def _build(name: str, block_tokens: int, num_ids: int, global_clock: bool,
           num_sessions: int, time_s: FloatArray, session: np.ndarray, chain_key: IntArray,
           inp: IntArray, out: IntArray, think: FloatArray, run_ptr: IntArray,
           run_start: np.ndarray, run_len: np.ndarray) -> Workload:
    n = len(time_s)
    if global_clock:
        return Workload(
            name=name, block_tokens=block_tokens, num_ids=num_ids, global_clock=True,
            num_sessions=0, time_s=time_s - (time_s.min() if n else 0.0),
            session=np.full(n, -1, dtype=np.int32), chain=np.full(n, -1, dtype=np.int32),
            turn=np.zeros(n, dtype=np.int32), input_tokens=inp, output_tokens=out,
            think_s=np.zeros(n), run_ptr=run_ptr, run_start=run_start, run_len=run_len,
            chain_ptr=np.zeros(1, dtype=np.int64), chain_req=np.zeros(0, dtype=np.int64),
            chain_session=np.zeros(0, dtype=np.int32), chain_offset_s=np.zeros(0))
    sel = np.flatnonzero(session >= 0)
    if len(sel) != n:
        raise ValueError(f"trace {name!r}: {n - len(sel)} requests have no session in a "
                         f"session-clock trace")
    order = np.lexsort((np.arange(n), time_s, chain_key))  # by chain, then time
    keys = chain_key[order]
    first = np.ones(n, dtype=bool)
    first[1:] = keys[1:] != keys[:-1]
    chain_starts = np.flatnonzero(first)
    chain_of_sorted = np.cumsum(first) - 1
    chain = np.empty(n, dtype=np.int32)
    chain[order] = chain_of_sorted
    turn = np.empty(n, dtype=np.int32)
    pos = np.arange(n) - chain_starts[chain_of_sorted]
    turn[order] = pos
    chain_ptr = np.append(chain_starts, n).astype(np.int64)
    chain_session = session[order[chain_starts]].astype(np.int32)
    # A chain starts at its first request's time on the session clock (0 for most
    # main agents; the spawn time plus its own offset for a sub-agent).
    chain_offset_s = time_s[order[chain_starts]].astype(np.float64)
    # Think time before each request: the trace's value, else the recorded gap.
    ts = time_s[order]
    gap = np.zeros(n)
    gap[1:] = ts[1:] - ts[:-1]
    th = think[order]
    th = np.where(np.isfinite(th), th, gap)
    th[first] = 0.0
    think_s = np.empty(n)
    think_s[order] = np.maximum(th, 0.0)
    return Workload(
        name=name, block_tokens=block_tokens, num_ids=num_ids, global_clock=False,
        num_sessions=num_sessions, time_s=time_s, session=session.astype(np.int32),
        chain=chain, turn=turn, input_tokens=inp, output_tokens=out, think_s=think_s,
        run_ptr=run_ptr, run_start=run_start, run_len=run_len, chain_ptr=chain_ptr,
        chain_req=order.astype(np.int64), chain_session=chain_session,
        chain_offset_s=chain_offset_s)


def from_sessions(sessions: Sequence[Sequence[tuple[Sequence[int], int, int, float]]],
                  block_tokens: int, name: str = "sessions") -> Workload:
    """A small session workload by hand (tests, examples).

    ``sessions[s]`` lists that session's requests in order as ``(block ids, input
    tokens, output tokens, think seconds)``; ids are namespaced per session as the
    Claude Code format is.
    """
    times: list[float] = []
    sess: list[int] = []
    inp: list[int] = []
    out: list[int] = []
    think: list[float] = []
    counts: list[int] = []
    ids: list[int] = []
    for s, reqs in enumerate(sessions):
        t = 0.0
        for i, (blocks, n_in, n_out, th) in enumerate(reqs):
            t += th if i else 0.0
            times.append(t)
            sess.append(s)
            inp.append(n_in)
            out.append(n_out)
            think.append(th if i else 0.0)
            counts.append(len(blocks))
            ids.extend((s << 40) | int(b) for b in blocks)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    run_ptr, run_start, run_len, num_ids = dense_runs(offsets, np.asarray(ids, dtype=np.int64))
    session = np.asarray(sess, dtype=np.int32)
    if not times:
        raise ValueError("from_sessions needs at least one request")
    return _build(name, block_tokens, num_ids, False, len(sessions),
                  np.asarray(times, dtype=np.float64), session, session.astype(np.int64),
                  np.asarray(inp, dtype=np.int64), np.asarray(out, dtype=np.int64),
                  np.asarray(think, dtype=np.float64), run_ptr, run_start, run_len)


def from_requests(requests: Sequence[tuple[float, Sequence[int], int, int]],
                  block_tokens: int, name: str = "requests") -> Workload:
    """A small global-clock workload by hand: ``(arrival s, block ids, input tokens,
    output tokens)`` per request, ids global."""
    counts = [len(r[1]) for r in requests]
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    ids = np.asarray([int(b) for r in requests for b in r[1]], dtype=np.int64)
    run_ptr, run_start, run_len, num_ids = dense_runs(offsets, ids)
    n = len(requests)
    return _build(name, block_tokens, num_ids, True, 0,
                  np.asarray([r[0] for r in requests], dtype=np.float64),
                  np.full(n, -1, dtype=np.int32), np.full(n, -1, dtype=np.int64),
                  np.asarray([r[2] for r in requests], dtype=np.int64),
                  np.asarray([r[3] for r in requests], dtype=np.int64),
                  np.zeros(n), run_ptr, run_start, run_len)


def cache_dir() -> Path:
    """Where converted traces are cached (``FLATCAKE_CACHE_DIR`` or ``~/.cache``)."""
    root = os.environ.get("FLATCAKE_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "flatcake"
    return base / "replay"


def cached_path(trace_path: str | Path) -> Path:
    """Cache file of a trace file: named by its path, size and modification time."""
    p = Path(trace_path).resolve()
    st = p.stat()
    tag = hashlib.sha256(f"{p}|{st.st_size}|{st.st_mtime_ns}|{_CACHE_VERSION}".encode()
                         ).hexdigest()[:16]
    return cache_dir() / f"{p.name}.{tag}.npz"
