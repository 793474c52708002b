"""FlatCake's native trace format: the simple way to bring your own trace.

JSON Lines, optionally gzipped. The first line is a header, then one request per line::

    {"flatcake_trace": 1, "block_size_tokens": 16, "clock": "session",
     "hash_scope": "session", "partial_last_block": false, "name": "my-service"}
    {"session": "chat-42", "t": 0.0, "in": 1200, "out": 80, "hash_ids": [7, 8, ...]}
    {"session": "chat-42", "t": 35.5, "in": 1350, "out": 64, "think_time": 30.1,
     "hash_ids": [7, 8, ..., 91]}

Header fields (``flatcake_trace`` and ``block_size_tokens`` are required):

- ``flatcake_trace``: format version, 1;
- ``block_size_tokens``: tokens per hashed block (> 0);
- ``clock``: ``"global"`` (``t`` is one clock for all requests; default) or
  ``"session"`` (``t`` counts from each session's start; ``session`` is then required);
- ``hash_scope``: ``"global"`` (ids are unique across the trace; default) or
  ``"session"`` (ids are numbered per session, must lie in ``[0, 2**40)``, and are
  namespaced on read so sessions never collide; sub-agents share their session's ids);
- ``partial_last_block``: whether the last, partial block is hashed, so that
  ``len(hash_ids)`` is ``ceil(in / block)`` (true) or ``floor(in / block)`` (false,
  default);
- ``name``: a label (default: the file name).

Request fields: ``t`` (seconds, >= 0), ``in`` and ``out`` (tokens, >= 0) are required;
``session`` (string or int), ``agent`` (0 = main agent, k >= 1 = sub-agent k; default
0), ``think_time`` (seconds before the request) and ``hash_ids`` (chained
prefix-block ids, ints) are optional, but ``hash_ids`` is on every request or on none.
Requests may come in any order: a global-clock trace is stably sorted by ``t``; a
session-clock trace is grouped by session (in order of first appearance) and sorted by
``t`` inside each session. :func:`write_native` writes any :class:`Trace` in this format
(with ``hash_scope: "global"``), so ``read_native(write_native(trace))`` is the same trace.
"""

from __future__ import annotations

import gzip
import math
from pathlib import Path
from typing import IO, Any

import numpy as np
import orjson

from flatcake.traces.hashlists import (
    HashListDecoder,
    JSONDecodeError,
    check_global_ids,
    lift_hash_lists,
    loads,
    namespace_ids,
)
from flatcake.traces.model import MAX_SESSIONS, Trace, build_trace
from flatcake.traces.readers.fields import Fields
from flatcake.traces.source import SkipLog, TraceFormatError, open_binary

FORMAT = "native"
VERSION = 1


class _Header:
    __slots__ = ("block_size", "clock", "name", "partial", "scope")

    def __init__(self, path: str | Path, line: bytes) -> None:
        try:
            obj = loads(line)
        except JSONDecodeError as exc:
            raise TraceFormatError(path, 1, "<header>", f"invalid JSON ({exc})") from None
        f = Fields(obj, path, 1, "header.")
        version = f.get_int("flatcake_trace")
        if version != VERSION:
            raise f.error("flatcake_trace", f"unsupported version {version}, expected {VERSION}")
        self.block_size = f.get_int("block_size_tokens", minimum=1)
        self.clock = f.get_str("clock", default="global")
        if self.clock not in ("global", "session"):
            raise f.error("clock", f"must be 'global' or 'session', got {self.clock!r}")
        self.scope = f.get_str("hash_scope", default="global")
        if self.scope not in ("global", "session"):
            raise f.error("hash_scope", f"must be 'global' or 'session', got {self.scope!r}")
        partial = f.obj.get("partial_last_block", False)
        if not isinstance(partial, bool):
            raise f.error("partial_last_block", f"must be true or false, got {partial!r}")
        self.partial = partial
        self.name = f.get_str("name", default=Path(path).name)


def read_native(path: str | Path, *, skip_bad: bool = False) -> Trace:
    """Read a native trace (plain or gzip); see the module docstring."""
    skips = SkipLog(skip_bad)
    decoder = HashListDecoder()
    sessions: dict[str, int] = {}
    rows: list[tuple[float, int, int, int, int, float]] = []
    hashes: list[np.ndarray] = []
    has_hashes: bool | None = None
    header: _Header | None = None
    with open_binary(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            if header is None:
                if lineno != 1:
                    raise TraceFormatError(path, lineno, "<header>",
                                           "the header must be the first line")
                header = _Header(path, line)
                continue
            try:
                row, h = _parse_request(path, lineno, line, header, decoder, sessions)
                if has_hashes is None:
                    has_hashes = h is not None
                elif has_hashes != (h is not None):
                    raise TraceFormatError(
                        path, lineno, "hash_ids",
                        "is on some requests only; give it on every request or on none")
            except TraceFormatError as err:
                decoder.reset()
                skips.handle(err)
                continue
            rows.append(row)
            if h is not None:
                hashes.append(h)
    if header is None:
        raise TraceFormatError(path, 1, "<header>", "file is empty")
    n = len(rows)
    cols = np.array(rows, dtype=np.float64).reshape(n, 6)
    time_s, sess = cols[:, 0], cols[:, 1].astype(np.int32)
    if header.clock == "session":
        order = np.lexsort((time_s, sess))  # by session, then time; stable
    else:
        order = np.argsort(time_s, kind="stable")
    cols = cols[order]
    hashes = [hashes[k] for k in order] if hashes else []
    time_s = cols[:, 0]
    if header.clock == "global" and n:
        time_s = time_s - time_s[0]
    return build_trace(
        name=header.name, source_format=FORMAT, block_size_tokens=header.block_size,
        clock="session" if header.clock == "session" else "global",
        has_hashes=bool(has_hashes), partial_last_block=header.partial, time_s=time_s,
        session=cols[:, 1].astype(np.int32) if sessions else None,
        agent=cols[:, 2].astype(np.int32),
        input_tokens=cols[:, 3].astype(np.int64), output_tokens=cols[:, 4].astype(np.int64),
        think_time_s=cols[:, 5],
        block_counts=[len(h) for h in hashes] if hashes else np.zeros(n, dtype=np.int64),
        block_hashes=np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.int64),
        session_names=list(sessions), num_skipped_lines=skips.count,
        skipped_examples=skips.examples)


def _parse_request(path: str | Path, lineno: int, line: bytes, header: _Header,
                   decoder: HashListDecoder, sessions: dict[str, int]
                   ) -> tuple[tuple[float, int, int, int, int, float], np.ndarray | None]:
    slim, spans = lift_hash_lists(line)
    fast = len(spans) == 1
    try:
        obj = loads(slim)
    except JSONDecodeError:
        fast = False
        try:
            obj = loads(line)
        except JSONDecodeError as exc:
            raise TraceFormatError(path, lineno, "<json>", f"invalid JSON ({exc})") from None
    f = Fields(obj, path, lineno)
    t = f.get_number("t")
    n_in = f.get_int("in")
    n_out = f.get_int("out")
    agent = f.get_int("agent", default=0)
    think = f.get_number("think_time", default=math.nan) if f.has("think_time") else math.nan
    session = -1
    if f.has("session"):
        raw_name = f.raw("session")
        if isinstance(raw_name, bool) or not isinstance(raw_name, str | int):
            raise f.error("session", f"must be a string or an int, got {raw_name!r}")
        name = str(raw_name)
        session = sessions.get(name, -1)
        if session < 0:
            if len(sessions) >= MAX_SESSIONS:
                raise f.error("session", f"more than {MAX_SESSIONS} sessions")
            session = sessions[name] = len(sessions)
    elif header.clock == "session" or header.scope == "session":
        raise f.error("session", f"is required with clock={header.clock!r} and "
                      f"hash_scope={header.scope!r}")
    h: np.ndarray | None = None
    if f.has("hash_ids"):
        raw = f.raw("hash_ids")
        try:
            if fast and type(raw) is int and raw == 0:
                h = decoder.decode(spans[0])
            else:
                h = decoder.decode_list(raw)
            if header.scope == "session":
                h = namespace_ids(h, session)
            else:
                check_global_ids(h)
        except ValueError as exc:
            raise f.error("hash_ids", str(exc)) from None
        bs = header.block_size
        expected = -(-n_in // bs) if header.partial else n_in // bs
        if len(h) != expected:
            rule = "ceil" if header.partial else "floor"
            raise f.error("hash_ids", f"has {len(h)} ids, expected {rule}(in / {bs}) = "
                          f"{expected} for in={n_in}")
    return (t, session, agent, n_in, n_out, think), h


def write_native(trace: Trace, path: str | Path) -> Path:
    """Write ``trace`` in the native format (gzip when ``path`` ends in ``.gz``)."""
    p = Path(path)
    opener: Any = gzip.open if p.suffix == ".gz" else open
    with opener(p, "wb") as out:
        _write(trace, out)
    return p


def _dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def _write(trace: Trace, out: IO[bytes]) -> None:
    header = {"flatcake_trace": VERSION, "block_size_tokens": trace.block_size_tokens,
              "clock": trace.clock, "hash_scope": "global",
              "partial_last_block": trace.partial_last_block, "name": trace.name}
    out.write(_dumps(header) + b"\n")
    names = trace.session_names
    for i in range(trace.num_requests):
        rec: dict[str, Any] = {}
        s = int(trace.session[i])
        if s >= 0:
            rec["session"] = names[s]
        if trace.agent[i]:
            rec["agent"] = int(trace.agent[i])
        rec["t"] = float(trace.time_s[i])
        rec["in"] = int(trace.input_tokens[i])
        rec["out"] = int(trace.output_tokens[i])
        think = float(trace.think_time_s[i])
        if not math.isnan(think):
            rec["think_time"] = think
        line = _dumps(rec)
        if trace.has_hashes:
            ids = ",".join(map(str, trace.blocks(i).tolist())).encode()
            line = line[:-1] + b',"hash_ids":[' + ids + b"]}"
        out.write(line + b"\n")
