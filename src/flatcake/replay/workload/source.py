"""Where a replay's workload comes from: a trace file (converted once and cached) or
the built-in generated workload."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from flatcake.replay.workload.trace import Workload, cached_path, from_trace

logger = logging.getLogger(__name__)

DEFAULT_SESSIONS = 128
"""Sessions of the built-in agent workload (about 9,000 requests and 18 M block accesses);
a (system, rate) run of it takes a few seconds. Fewer sessions cannot offer the default
sweep's top rate (``replay.node.arrivals``: 64 sessions reach about 0.85 req/s, 128 about
1.5 with the 60 s think cap)."""

SESSIONS_BY_KIND = {"agent": DEFAULT_SESSIONS, "chat": 4096, "mixed": 1280}
"""Default sessions of each built-in workload (``--workload``). ``chat``: Kimi-like
chats (``traces.generator.ChatParams``), 1.8 requests per session, so 4,096 sessions
give about 7,000 requests, enough to fill the paper node's 8 GiB host budget many times
over at the sweep's rates. ``mixed``: 5% agent sessions (64, as many as the agent
workload's first half) among chats, about two thirds of the requests agent turns."""

MIXED_CHAT_SHARE = 0.95
"""Share of chat sessions in the built-in ``mixed`` workload."""


def builtin_spec(sessions: int | None = None, kind: str = "agent", seed: int = 0,
                 block_tokens: int = 64, context_tokens: int | None = None) -> Any:
    """The generator spec of the built-in workload ``kind`` (``agent``, ``chat`` or
    ``mixed``); ``sessions`` defaults to ``SESSIONS_BY_KIND[kind]``.

    ``context_tokens`` caps agent contexts (the llama70b 16K/64K comparison): sessions
    start from a 2K-token prefix and a few K tokens of history, grow as the Claude Code
    sessions do, and compact to 30% when the next turn would pass the cap.
    """
    from flatcake.traces.generator import AgentParams, LogNormal, WorkloadSpec

    agent = AgentParams()
    if context_tokens is not None:
        if context_tokens < 8192:
            raise ValueError(f"context_tokens must be >= 8192, got {context_tokens}")
        agent = dataclasses.replace(
            agent, prefix_tokens=2048,
            first_history_fresh=LogNormal(min(4000.0, context_tokens / 4), 0.8),
            resumed_share=0.0, compact_above_tokens=context_tokens,
            long_window_share=0.0, long_window_compact_above_tokens=context_tokens)
    if kind not in SESSIONS_BY_KIND:
        raise ValueError(f"unknown built-in workload {kind!r}; choose one of "
                         f"{', '.join(SESSIONS_BY_KIND)}")
    return WorkloadSpec(kind=kind,  # type: ignore[arg-type]
                        num_sessions=SESSIONS_BY_KIND[kind] if sessions is None else sessions,
                        chat_share=MIXED_CHAT_SHARE, seed=seed,
                        block_size_tokens=block_tokens, agent=agent)


def load_workload(trace: str | Path | None, *, format: str | None = None,
                  sessions: int | None = None, kind: str = "agent", seed: int = 0,
                  block_tokens: int = 64, context_tokens: int | None = None,
                  use_cache: bool = True) -> tuple[Workload, dict[str, float]]:
    """The workload of ``trace`` (any format ``flatcake.traces`` reads), or the built-in
    generated one when ``trace`` is None. Returns it with timings (seconds)."""
    timings: dict[str, float] = {}
    start = time.perf_counter()
    if trace is None:
        from flatcake.traces.generator import generate_workload

        spec = builtin_spec(sessions, kind, seed, block_tokens, context_tokens)
        wl = from_trace(generate_workload(spec))
        timings["generate_s"] = time.perf_counter() - start
        return wl, timings
    if context_tokens is not None:
        raise ValueError("--context-tokens shapes the built-in workload; it does not apply "
                         "to a trace file")
    path = Path(trace)
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    cache = cached_path(path) if use_cache and format is None else None
    if cache is not None and cache.is_file():
        try:
            wl = Workload.load(cache)
            timings["load_cached_s"] = time.perf_counter() - start
            return wl, timings
        except (OSError, ValueError, KeyError) as exc:
            logger.warning("ignoring unreadable workload cache %s: %s", cache, exc)
    from flatcake.traces.load import read_trace

    tr = read_trace(path, format=format)
    timings["read_trace_s"] = time.perf_counter() - start
    t1 = time.perf_counter()
    wl = from_trace(tr)
    del tr
    timings["convert_s"] = time.perf_counter() - t1
    if cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(".tmp.npz")
            wl.save(tmp)
            tmp.replace(cache)
        except OSError as exc:
            logger.warning("cannot cache the converted trace at %s: %s", cache, exc)
    return wl, timings
