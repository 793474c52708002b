"""A trace's sessions as load-generator sessions, fitted to the server's context.

The trace's block ids are kept as they are (reuse between requests stays exactly the
trace's); what changes is the number of tokens each id stands for. A trace's contexts
are often far longer than a test server's ``max_model_len`` (Claude Code sessions reach
880K tokens), so by default each block becomes ``block_tokens`` tokens, scaled down from
the trace's block size until ``FIT_QUANTILE`` of the chosen requests fit the budget
(``max_model_len - max_tokens``); the longer requests are cut to their first blocks,
which are the ones they share. An explicit ``block_tokens`` is used as given, and every
request that does not fit is cut. A request's tokens past its last full block (the
Claude Code format drops them from its hash list) become its own tail, scaled alike.

Sessions are the trace's, turns in the trace's time order (sub-agents included: the
parent waits for them); a trace without sessions (Mooncake) sends each request as a
session of one turn, in arrival order. Think times are not replayed: the driver's rate
or concurrency paces the requests.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from flatcake.loadgen.prompts import TokenSpace
from flatcake.loadgen.workload import Session, Turn, Workload, session_name
from flatcake.traces.model import Trace

FIT_QUANTILE = 0.9
"""Share of requests that fit the context budget whole when ``block_tokens`` is scaled:
the longest 10 % are cut rather than shrinking every block to a token or two for them."""


def _session_requests(trace: Trace, sessions: int | None) -> list[tuple[str, np.ndarray]]:
    """(name, request indices in order) of the first ``sessions`` sessions."""
    if trace.num_sessions:
        order = np.arange(trace.num_sessions)
        if trace.clock == "global":  # start sessions in order of their first request
            firsts = [float(trace.time_s[trace.requests_of_session(int(s))].min(initial=0))
                      for s in order]
            order = order[np.argsort(firsts, kind="stable")]
        picked = order[:sessions] if sessions is not None else order
        return [(trace.session_names[s] or f"session-{s}", trace.requests_of_session(int(s)))
                for s in picked if len(trace.requests_of_session(int(s)))]
    n = trace.num_requests if sessions is None else min(sessions, trace.num_requests)
    return [(f"request-{i}", np.array([i])) for i in range(n)]


def fit_block_tokens(trace: Trace, requests: np.ndarray, budget_tokens: int) -> int:
    """Tokens per block so that ``FIT_QUANTILE`` of ``requests`` fit ``budget_tokens``
    (never more than the trace's own block size, never below 1)."""
    bs = trace.block_size_tokens
    if not len(requests):
        return bs
    lengths = np.maximum(trace.input_tokens[requests], trace.num_blocks[requests] * bs)
    longest = float(np.quantile(lengths, FIT_QUANTILE))
    if longest <= budget_tokens:
        return bs
    return max(1, int(budget_tokens * bs // longest))


def trace_workload(trace: Trace, *, budget_tokens: int, max_tokens: int, tokens: TokenSpace,
                   block_tokens: int | None = None, sessions: int | None = None) -> Workload:
    """The first ``sessions`` sessions of ``trace`` (all when None), fitted to
    ``budget_tokens`` of prompt; see the module docstring."""
    if not trace.has_hashes:
        raise ValueError(f"{trace.name} has no block hashes (lengths only): its reuse is "
                         "unknown, so it cannot drive the load generator")
    if sessions is not None and sessions <= 0:
        raise ValueError(f"--sessions must be > 0, got {sessions}")
    if budget_tokens <= 0:
        raise ValueError(f"no room for a prompt: the context budget is {budget_tokens} tokens")
    chosen = [(session_name(n, tokens.seed), r) for n, r in _session_requests(trace, sessions)]
    every = np.concatenate([r for _, r in chosen]) if chosen else np.zeros(0, dtype=np.int64)
    scaled = block_tokens is None
    bt = fit_block_tokens(trace, every, budget_tokens) if block_tokens is None else block_tokens
    if bt <= 0:
        raise ValueError(f"--block-tokens must be > 0, got {bt}")
    if bt > budget_tokens:
        raise ValueError(f"--block-tokens {bt} exceeds the context budget of {budget_tokens} "
                         "tokens (--max-model-len minus --max-tokens)")
    bs = trace.block_size_tokens
    turns: list[tuple[str, list[tuple[int, Turn]]]] = []
    cut = 0
    for name, reqs in chosen:
        mine = []
        for i in reqs.tolist():
            ids = trace.blocks(i)
            rest = max(0, int(trace.input_tokens[i]) - len(ids) * bs)
            tail = round(rest * bt / bs)
            keep = min(len(ids), budget_tokens // bt)
            if keep < len(ids) or len(ids) * bt + tail > budget_tokens:
                cut += 1
                tail = min(tail, budget_tokens - keep * bt)
            mine.append((int(trace.agent[i]), Turn(block_ids=ids[:keep],
                                                  tail_tokens=max(tail, 0 if keep else 1),
                                                  tail_key=i, max_tokens=max_tokens)))
        turns.append((name, mine))
    n_req = sum(len(m) for _, m in turns)
    per = f"{bt} token{'s' if bt != 1 else ''} per block"
    how = f"{per} (scaled from {bs})" if scaled and bt != bs else per
    desc = (f"{trace.name}: {len(turns)} sessions, {n_req} requests, {how}, "
            f"{cut} cut to {budget_tokens} prompt tokens")
    return Workload(description=desc, sessions=_sessions(turns), tokens=tokens,
                    block_tokens=bt, num_requests=n_req, num_cut=cut,
                    meta={"trace": trace.name, "trace_block_tokens": bs, "scaled": scaled})


def _sessions(turns: list[tuple[str, list[tuple[int, Turn]]]]) -> Iterator[Session]:
    """One session per main agent; a sub-agent's turns stay in the parent's flow (the
    parent waits for them) and carry the sub-agent's own session id."""
    for name, mine in turns:
        yield Session(name=name, turns=tuple(t for _, t in mine),
                      agents=tuple(a for a, _ in mine))


def builtin_trace(kind: str, sessions: int | None, seed: int) -> Trace:
    """The built-in ``agent`` / ``chat`` / ``mixed`` workload, as ``flatcake replay``
    generates it (``replay.workload.source.builtin_spec``)."""
    from flatcake.replay.workload.source import builtin_spec
    from flatcake.traces.generator import generate_workload

    return generate_workload(builtin_spec(sessions, kind, seed))
