"""Built-in workload generator: agent and chat sessions with chained block ids.

This is the workload ``flatcake analyze`` and the replay simulator use when no trace is
given. It writes a session-clock :class:`Trace` (each session's ``time_s`` counts from
its start; a replay chooses session arrivals) with globally unique chained block ids,
full blocks only (like the Claude Code trace).

Agent sessions follow the Claude Code statistics of ``shared/traces/README.md`` and
figures measured on that trace with ``flatcake analyze`` and its reader (each default
below names its source). A session starts from a tools + system prefix, shared by all
sessions as a real deployment sends the same tool definitions (``share_prefix``; the
trace itself cannot show this because its ids are per session), plus its first
history; every turn appends a heavy-tailed amount of context; between turns the client
thinks; some sessions reset their context (compaction or a re-rendered history), and a
few turns spawn a sub-agent whose requests the parent waits for.

Chat sessions follow the Kimi (Mooncake) chat statistics: a short shared system
prompt, a first message, few turns with short replies and long gaps between them, so
most blocks are used once and reuses come back minutes later.

Reproducibility: everything is drawn from one ``numpy.random.Generator`` seeded by
``WorkloadSpec.seed``. Per-session and per-turn quantities are drawn by stratified
sampling (one uniform in each of n equal strata, shuffled), so even a small workload
reproduces its parameters closely; ``tests/traces`` checks this with ``analyze``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from flatcake.traces.model import SubAgent, Trace, build_trace
from flatcake.traces.workload_spec import (  # noqa: F401  (re-exported)
    WORKLOAD_KINDS,
    AgentParams,
    ChatParams,
    LogNormal,
    ServiceParams,
    WorkloadKind,
    WorkloadSpec,
)


class _Draws:
    """Stratified draws: ``n`` uniforms, one per stratum ``[k/n, (k+1)/n)``, shuffled."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def uniform(self, n: int) -> np.ndarray:
        return (self.rng.permutation(n) + self.rng.random(n)).clip(1e-12, n - 1e-12) / n

    def lognormal(self, law: LogNormal, n: int) -> np.ndarray:
        return law.at(self.uniform(n)) if n else np.zeros(0)


class _Builder:
    """Accumulates requests session by session, handing out fresh block ids."""

    def __init__(self, spec: WorkloadSpec) -> None:
        self.bs = spec.block_size_tokens
        self.next_id = 0
        self.cols: dict[str, list[Any]] = {k: [] for k in (
            "time_s", "session", "agent", "input_tokens", "output_tokens", "think_time_s")}
        self.hashes: list[np.ndarray] = []
        self.names: list[str] = []
        self.prefixes: list[int] = []
        self.subagents: list[SubAgent] = []

    def fresh(self, n: int) -> np.ndarray:
        ids = np.arange(self.next_id, self.next_id + n, dtype=np.int64)
        self.next_id += n
        return ids

    def request(self, session: int, agent: int, t: float, ctx: np.ndarray, n_in: int,
                n_out: int, think: float) -> None:
        c = self.cols
        c["time_s"].append(t)
        c["session"].append(session)
        c["agent"].append(agent)
        c["input_tokens"].append(n_in)
        c["output_tokens"].append(n_out)
        c["think_time_s"].append(think)
        self.hashes.append(ctx[:n_in // self.bs])


class _Context:
    """A growing context: its token count and the ids of its full blocks."""

    def __init__(self, builder: _Builder, prefix_ids: np.ndarray, tokens: int) -> None:
        self.b = builder
        self.tokens = 0
        self.ids = np.zeros(0, dtype=np.int64)
        self._set(prefix_ids, tokens)

    def _set(self, kept: np.ndarray, tokens: int) -> None:
        want = tokens // self.b.bs
        self.ids = np.concatenate([kept[:want], self.b.fresh(max(0, want - len(kept)))])
        self.tokens = tokens

    def grow(self, tokens: int, cap: int) -> None:
        new_tokens = min(self.tokens + tokens, cap)
        want = new_tokens // self.b.bs
        if want > len(self.ids):
            self.ids = np.concatenate([self.ids, self.b.fresh(want - len(self.ids))])
        self.tokens = new_tokens

    def reset(self, keep_blocks: int, tokens: int) -> None:
        """Keep the first ``keep_blocks`` ids and rewrite the rest with ``tokens`` in all."""
        self._set(self.ids[:keep_blocks], tokens)


def generate_workload(spec: WorkloadSpec | None = None) -> Trace:
    """Generate the workload ``spec`` describes (the default agent workload if None)."""
    spec = spec or WorkloadSpec()
    rng = np.random.default_rng(spec.seed)
    draws = _Draws(rng)
    b = _Builder(spec)
    n_chat = spec.num_chat_sessions
    kinds = np.array(["chat"] * n_chat + ["agent"] * (spec.num_sessions - n_chat))
    rng.shuffle(kinds)
    agent_prefix = b.fresh(spec.agent.prefix_tokens // b.bs) if spec.agent.share_prefix else None
    chat_prefix = b.fresh(spec.chat.prefix_tokens // b.bs)
    agent_plan = _plan_agents(spec.agent, spec.num_sessions - n_chat, draws)
    chat_turns = _chat_turns(spec.chat, n_chat, draws)
    chat_first = draws.lognormal(spec.chat.first_message_tokens, n_chat)
    a_idx = c_idx = 0
    for s, kind in enumerate(kinds):
        if kind == "agent":
            _agent_session(spec, b, draws, s, agent_plan, a_idx, agent_prefix)
            b.names.append(f"agent-{s:05d}")
            b.prefixes.append(spec.agent.prefix_tokens)
            a_idx += 1
        else:
            _chat_session(spec, b, draws, s, int(chat_turns[c_idx]), int(chat_first[c_idx]),
                          chat_prefix)
            b.names.append(f"chat-{s:05d}")
            b.prefixes.append(spec.chat.prefix_tokens)
            c_idx += 1
    c = b.cols
    return build_trace(
        name=f"generated-{spec.kind}-{spec.num_sessions}s-seed{spec.seed}",
        source_format="generated", block_size_tokens=b.bs, clock="session",
        has_hashes=True, partial_last_block=False, time_s=c["time_s"],
        input_tokens=c["input_tokens"], output_tokens=c["output_tokens"],
        block_counts=[len(h) for h in b.hashes],
        block_hashes=np.concatenate(b.hashes) if b.hashes else np.zeros(0, dtype=np.int64),
        session=c["session"], agent=c["agent"], think_time_s=c["think_time_s"],
        session_names=b.names, session_prefix_tokens=b.prefixes, subagents=b.subagents)


@dataclass(frozen=True, slots=True)
class _AgentPlan:
    """Per-session draws for all agent sessions (stratified across sessions)."""

    turns: np.ndarray
    first_history: np.ndarray
    compact_above: np.ndarray


def _plan_agents(p: AgentParams, n: int, draws: _Draws) -> _AgentPlan:
    turns = np.maximum(1, np.rint(draws.lognormal(p.turns, n))).astype(np.int64)
    resumed = draws.uniform(n) < p.resumed_share
    fresh = draws.lognormal(p.first_history_fresh, n)
    long = draws.lognormal(p.first_history_resumed, n)
    long_window = draws.uniform(n) < p.long_window_share
    return _AgentPlan(
        turns=turns, first_history=np.where(resumed, long, fresh),
        compact_above=np.where(long_window, p.long_window_compact_above_tokens,
                               p.compact_above_tokens))


def _chat_turns(p: ChatParams, n: int, draws: _Draws) -> np.ndarray:
    """1 with probability ``single_turn_share``, else 2 + geometric (mean ``multi_turn_mean``),
    by inverse CDF of one stratified uniform per session."""
    u = draws.uniform(n)
    turns = np.ones(n, dtype=np.int64)
    multi = u >= p.single_turn_share
    if multi.any():
        # Rescale the upper part of u to (0, 1) for the geometric tail.
        v = (u[multi] - p.single_turn_share) / (1.0 - p.single_turn_share)
        q = 1.0 - 1.0 / (p.multi_turn_mean - 1.0)  # chance of one more turn after two
        extra = (np.floor(np.log1p(-v) / math.log(q)) if q > 0 else np.zeros(len(v)))
        turns[multi] = 2 + extra.astype(np.int64)
    return turns


def _agent_session(spec: WorkloadSpec, b: _Builder, draws: _Draws, s: int, plan: _AgentPlan,
                   k: int, shared_prefix: np.ndarray | None) -> None:
    p = spec.agent
    rng = draws.rng
    turns = int(plan.turns[k])
    growth = draws.lognormal(p.growth_tokens, turns)
    outs = np.rint(draws.lognormal(p.output_tokens, turns)).astype(np.int64)
    thinks = draws.lognormal(p.think_time_s, turns)
    thinks[0] = 0.0
    prefix_ids = shared_prefix if shared_prefix is not None else b.fresh(p.prefix_tokens // b.bs)
    limit = int(plan.compact_above[k])
    ctx = _Context(b, prefix_ids, min(p.prefix_tokens + int(plan.first_history[k]), limit))
    t = 0.0
    for turn in range(turns):
        if turn:
            grown = ctx.tokens + int(growth[turn])
            if grown > limit or rng.random() < p.rerender_reset_per_turn:
                # A major reset keeps (part of) the prefix and rewrites the history,
                # shrunk by a compaction; it shares less than half of the last request.
                tokens = int(grown * p.compaction_ratio) if grown > limit else ctx.tokens
                keep = min(len(prefix_ids), max(0, (len(ctx.ids) - 1) // 2))
                ctx.reset(keep, max(p.prefix_tokens + b.bs, tokens))
            else:
                ctx.grow(int(growth[turn]), limit)
            t += float(thinks[turn])
        b.request(s, 0, t, ctx.ids, ctx.tokens, int(outs[turn]), float(thinks[turn]))
        t += spec.service.time_s(float(outs[turn]))
        if turn + 1 < turns and rng.random() < p.subagent_spawn_per_turn:
            t = _subagent(spec, b, draws, s, t)


def _subagent(spec: WorkloadSpec, b: _Builder, draws: _Draws, s: int, spawn_s: float) -> float:
    """Run one sub-agent spawned at ``spawn_s``; return when the parent may go on."""
    p = spec.agent
    agent = sum(1 for sa in b.subagents if sa.session == s) + 1
    b.subagents.append(SubAgent(session=s, agent=agent, parent_agent=0, spawn_time_s=spawn_s,
                                name=f"sub-{s}-{agent}", kind="generated"))
    turns = max(1, round(float(draws.lognormal(p.subagent_turns, 1)[0])))
    first = int(draws.lognormal(p.subagent_first_tokens, 1)[0])
    growth = draws.lognormal(p.growth_tokens, turns)
    outs = np.rint(draws.lognormal(p.output_tokens, turns)).astype(np.int64)
    thinks = draws.lognormal(p.think_time_s, turns)
    thinks[0] = 0.0
    ctx = _Context(b, np.zeros(0, dtype=np.int64), min(first, p.compact_above_tokens))
    t = spawn_s
    for turn in range(turns):
        if turn:
            ctx.grow(int(growth[turn]), p.compact_above_tokens)
            t += float(thinks[turn])
        b.request(s, agent, t, ctx.ids, ctx.tokens, int(outs[turn]), float(thinks[turn]))
        t += spec.service.time_s(float(outs[turn]))
    return t


def _chat_session(spec: WorkloadSpec, b: _Builder, draws: _Draws, s: int, turns: int,
                  first: int, prefix_ids: np.ndarray) -> None:
    p = spec.chat
    follow = draws.lognormal(p.followup_tokens, turns)
    outs = np.rint(draws.lognormal(p.output_tokens, turns)).astype(np.int64)
    thinks = draws.lognormal(p.think_time_s, turns)
    thinks[0] = 0.0
    ctx = _Context(b, prefix_ids, p.prefix_tokens + first)
    t = 0.0
    cap = 1 << 40
    for turn in range(turns):
        if turn:
            # The next prompt holds the previous reply and the new user message.
            ctx.grow(int(outs[turn - 1]) + int(follow[turn]), cap)
            t += float(thinks[turn])
        b.request(s, 0, t, ctx.ids, ctx.tokens, int(outs[turn]), float(thinks[turn]))
        t += spec.service.time_s(float(outs[turn]))
