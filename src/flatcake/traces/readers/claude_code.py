"""Reader for the Claude Code session format (WEKA ``kv-cache-tester`` traces).

One JSON object per line, one session per object (see ``shared/traces/README.md``)::

    {"id": "trace_0001", "block_size": 64, "hash_id_scope": "local",
     "tool_tokens": 12974, "system_tokens": 4243,
     "requests": [
        {"t": 0.0, "type": "n", "in": 71175, "out": 169, "think_time": 0.0,
         "hash_ids": [1, 2, ...]},                     # floor(in / 64) ids
        {"t": 95.0, "type": "subagent", "agent_id": "...", "subagent_type": "...",
         "requests": [{"t": 0.0, ...}, ...]},          # t relative to the spawn
        ...]}

Mapping to the model: the clock is per session; a sub-agent's request is placed at
spawn ``t`` plus its own ``t`` (sub-agents may nest; offsets add up) and the session's
requests are then stably sorted by time. ``"local"`` ids are namespaced per session
(sub-agents share their session's namespace). A malformed session is one bad line:
with ``skip_bad`` the whole session is dropped and counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flatcake.traces.hashlists import (
    HashListDecoder,
    JSONDecodeError,
    check_global_ids,
    lift_hash_lists,
    loads,
    namespace_ids,
)
from flatcake.traces.model import MAX_SESSIONS, SubAgent, Trace, build_trace
from flatcake.traces.readers.fields import Fields
from flatcake.traces.source import SkipLog, TraceFormatError, open_binary

FORMAT = "claude-code"


class _Reparse(Exception):
    """The lifted hash lists did not line up with the parsed requests."""


@dataclass(slots=True)
class _Session:
    """One session's requests in file order (sub-agent requests where they were spawned)."""

    time_s: list[float] = field(default_factory=list)
    agent: list[int] = field(default_factory=list)
    input_tokens: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    think_time_s: list[float] = field(default_factory=list)
    hashes: list[np.ndarray] = field(default_factory=list)
    where: list[str] = field(default_factory=list)  # field path of each request, for errors
    subagents: list[SubAgent] = field(default_factory=list)


class _SessionParser:
    """Parses one session line; ``spans`` is None on the slow (fully parsed) path."""

    def __init__(self, path: str | Path, line: int, index: int, block_size: int,
                 spans: list[bytes] | None, decoder: HashListDecoder) -> None:
        self.path = path
        self.line = line
        self.index = index
        self.block_size = block_size
        self.spans = spans
        self.next_span = 0
        self.decoder = decoder
        self.out = _Session()

    def parse_requests(self, entries: Any, prefix: str, base_s: float, agent: int,
                       parent: Fields) -> None:
        if not isinstance(entries, list):
            raise parent.error(prefix.rstrip("."), "must be a list")
        for j, entry in enumerate(entries):
            f = Fields(entry, self.path, self.line, f"{prefix}[{j}].")
            if f.obj.get("type") == "subagent":
                spawn_s = base_s + f.get_number("t")
                sub = len(self.out.subagents) + 1
                self.out.subagents.append(SubAgent(
                    session=self.index, agent=sub, parent_agent=agent, spawn_time_s=spawn_s,
                    name=f.get_str("agent_id", default=""),
                    kind=f.get_str("subagent_type", default="")))
                self.parse_requests(f.raw("requests"), f"{prefix}[{j}].requests", spawn_s, sub, f)
                continue
            self._request(f, base_s, agent)

    def _request(self, f: Fields, base_s: float, agent: int) -> None:
        t = f.get_number("t")
        n_in = f.get_int("in")
        n_out = f.get_int("out")
        think = f.get_number("think_time", default=float("nan")) if f.has("think_time") \
            else float("nan")
        raw = f.raw("hash_ids")
        try:
            if self.spans is not None:
                if type(raw) is not int or raw != self.next_span:
                    raise _Reparse
                self.next_span += 1
                hashes = self.decoder.decode(self.spans[raw])
            else:
                hashes = self.decoder.decode_list(raw)
        except ValueError as exc:
            raise f.error("hash_ids", str(exc)) from None
        if len(hashes) != n_in // self.block_size:
            raise f.error("hash_ids", f"has {len(hashes)} ids, expected floor(in / "
                          f"{self.block_size}) = {n_in // self.block_size} for in={n_in}")
        o = self.out
        o.time_s.append(base_s + t)
        o.agent.append(agent)
        o.input_tokens.append(n_in)
        o.output_tokens.append(n_out)
        o.think_time_s.append(think)
        o.hashes.append(hashes)
        o.where.append(f.prefix)


def read_claude_code(path: str | Path, *, skip_bad: bool = False) -> Trace:
    """Read a Claude Code session file (plain or gzip); see the module docstring."""
    skips = SkipLog(skip_bad)
    decoder = HashListDecoder()
    block_size: int | None = None
    names: list[str] = []
    prefix_tokens: list[int] = []
    cols: dict[str, list[np.ndarray]] = {k: [] for k in (
        "time_s", "session", "agent", "input_tokens", "output_tokens", "think_time_s")}
    counts: list[np.ndarray] = []
    hashes: list[np.ndarray] = []  # one array per session
    subagents: list[SubAgent] = []
    with open_binary(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                name, prefix, bs, sess = _parse_line(path, lineno, line, len(names),
                                                     block_size, decoder)
            except TraceFormatError as err:
                skips.handle(err)
                continue
            block_size = bs
            index = len(names)
            if index >= MAX_SESSIONS:
                raise TraceFormatError(path, lineno, "<session>",
                                       f"more than {MAX_SESSIONS} sessions")
            names.append(name)
            prefix_tokens.append(prefix)
            order = np.argsort(np.asarray(sess.time_s), kind="stable")
            for key in ("time_s", "agent", "input_tokens", "output_tokens", "think_time_s"):
                cols[key].append(np.asarray(getattr(sess, key))[order])
            cols["session"].append(np.full(len(order), index, dtype=np.int32))
            counts.append(np.asarray([len(sess.hashes[k]) for k in order], dtype=np.int64))
            if len(order):
                hashes.append(np.concatenate([sess.hashes[k] for k in order]))
            subagents.extend(sess.subagents)
    all_hashes = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.int64)
    del hashes
    col = {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()}
    return build_trace(
        name=Path(path).name, source_format=FORMAT, block_size_tokens=block_size or 64,
        clock="session", has_hashes=True, partial_last_block=False,
        time_s=col["time_s"], input_tokens=col["input_tokens"],
        output_tokens=col["output_tokens"],
        block_counts=np.concatenate(counts) if counts else np.zeros(0, dtype=np.int64),
        block_hashes=all_hashes, session=col["session"], agent=col["agent"],
        think_time_s=col["think_time_s"],
        session_names=names, session_prefix_tokens=prefix_tokens, subagents=subagents,
        num_skipped_lines=skips.count, skipped_examples=skips.examples)


def _parse_line(path: str | Path, lineno: int, line: bytes, index: int,
                block_size: int | None, decoder: HashListDecoder
                ) -> tuple[str, int, int, _Session]:
    slim, lifted = lift_hash_lists(line)
    spans: list[bytes] | None = lifted
    try:
        obj = loads(slim)
    except JSONDecodeError:
        obj, spans = _loads_or_error(path, lineno, line), None
    try:
        return _parse_session(path, lineno, obj, spans, index, block_size, decoder)
    except _Reparse:
        obj = _loads_or_error(path, lineno, line)
        return _parse_session(path, lineno, obj, None, index, block_size, decoder)


def _loads_or_error(path: str | Path, lineno: int, line: bytes) -> Any:
    try:
        return loads(line)
    except JSONDecodeError as exc:
        raise TraceFormatError(path, lineno, "<json>", f"invalid JSON ({exc})") from None


def _parse_session(path: str | Path, lineno: int, obj: Any, spans: list[bytes] | None,
                   index: int, block_size: int | None, decoder: HashListDecoder
                   ) -> tuple[str, int, int, _Session]:
    f = Fields(obj, path, lineno)
    bs = f.get_int("block_size", minimum=1)
    if block_size is not None and bs != block_size:
        raise f.error("block_size", f"is {bs}, but earlier sessions use {block_size}; "
                      "one trace has one block size")
    scope = f.get_str("hash_id_scope", default="local")
    if scope not in ("local", "global"):
        raise f.error("hash_id_scope", f"must be 'local' or 'global', got {scope!r}")
    name = f.get_str("id", default=f"line-{lineno}")
    prefix = -1
    if f.has("tool_tokens") or f.has("system_tokens"):
        prefix = f.get_int("tool_tokens", default=0) + f.get_int("system_tokens", default=0)
    decoder.reset()
    parser = _SessionParser(path, lineno, index, bs, spans, decoder)
    parser.parse_requests(f.raw("requests"), "requests", 0.0, 0, f)
    if spans is not None and parser.next_span != len(spans):
        raise _Reparse
    out = parser.out
    # Check and namespace the session's ids in one pass; locate a bad id by request.
    try:
        if out.hashes:
            joined = np.concatenate(out.hashes)
            joined = namespace_ids(joined, index) if scope == "local" else joined
            if scope == "global":
                check_global_ids(joined)
            bounds = np.cumsum([len(h) for h in out.hashes])[:-1]
            out.hashes = np.split(joined, bounds)
    except ValueError:
        for where, h in zip(out.where, out.hashes, strict=True):
            try:
                namespace_ids(h, index) if scope == "local" else check_global_ids(h)
            except ValueError as exc:
                raise TraceFormatError(path, lineno, where + "hash_ids", str(exc)) from None
        raise
    return name, prefix, bs, out
