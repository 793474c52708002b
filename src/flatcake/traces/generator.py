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
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Literal

import numpy as np

from flatcake.traces.model import SubAgent, Trace, build_trace

_Z90 = NormalDist().inv_cdf(0.9)
_inv_cdf = np.vectorize(NormalDist().inv_cdf, otypes=[np.float64])

WorkloadKind = Literal["agent", "chat", "mixed"]
WORKLOAD_KINDS: tuple[str, ...] = ("agent", "chat", "mixed")


@dataclass(frozen=True, slots=True)
class LogNormal:
    """A lognormal law given by its median and ``sigma`` (standard deviation of the log)."""

    median: float
    sigma: float

    def __post_init__(self) -> None:
        if not (self.median > 0 and math.isfinite(self.median)):
            raise ValueError(f"LogNormal.median must be > 0, got {self.median!r}")
        if not (self.sigma >= 0 and math.isfinite(self.sigma)):
            raise ValueError(f"LogNormal.sigma must be >= 0, got {self.sigma!r}")

    @classmethod
    def from_median_mean(cls, median: float, mean: float) -> LogNormal:
        if mean < median:
            raise ValueError(f"a lognormal mean ({mean}) cannot be below its median ({median})")
        return cls(median, math.sqrt(2.0 * math.log(mean / median)))

    @classmethod
    def from_median_p90(cls, median: float, p90: float) -> LogNormal:
        if p90 < median:
            raise ValueError(f"p90 ({p90}) cannot be below the median ({median})")
        return cls(median, math.log(p90 / median) / _Z90)

    @property
    def mean(self) -> float:
        return self.median * math.exp(self.sigma**2 / 2.0)

    def at(self, u: np.ndarray) -> np.ndarray:
        """Quantiles at probabilities ``u`` (0 < u < 1)."""
        return self.median * np.exp(self.sigma * _inv_cdf(u))


@dataclass(frozen=True, slots=True)
class ServiceParams:
    """Server time of one request, used only to space a session's requests in time.

    ``service_time_s = fixed_s + output_tokens / decode_tokens_per_s``, fitted to the
    Claude Code trace's ``api_time`` (median 6.2 s, p90 18.4 s) against its output
    tokens (median 220, p90 911). A replay recomputes service times with its own models.
    """

    fixed_s: float = 2.3
    decode_tokens_per_s: float = 56.6

    def __post_init__(self) -> None:
        if self.fixed_s < 0:
            raise ValueError(f"ServiceParams.fixed_s must be >= 0, got {self.fixed_s}")
        if self.decode_tokens_per_s <= 0:
            raise ValueError("ServiceParams.decode_tokens_per_s must be > 0, got "
                             f"{self.decode_tokens_per_s}")

    def time_s(self, output_tokens: float) -> float:
        return self.fixed_s + output_tokens / self.decode_tokens_per_s


@dataclass(frozen=True, slots=True)
class AgentParams:
    """Claude Code-like agent sessions. Sources: "README" is ``shared/traces/README.md``;
    "measured" is the shared Claude Code trace read and analysed by this package.

    Attributes:
        turns: main-agent requests per session; README median 47, mean 71.3.
        prefix_tokens: tools + system prompt; README median ``tool_tokens +
            system_tokens`` = 14,948.
        share_prefix: all sessions send the same prefix (same block ids). Real
            deployments do; the trace's per-session ids cannot show it.
        first_history_fresh / first_history_resumed / resumed_share: first-request
            input beyond the prefix, a mixture of fresh sessions and sessions resumed
            with a long history; fitted to the measured first-request input (median
            23.2K, mean 88.5K, p90 252K tokens).
        growth_tokens: context appended per turn (reply, tool results, user text);
            measured context growth median 10, mean 27.1, p90 56 blocks of 64 tokens.
        output_tokens: README mean 443; measured median 220.
        think_time_s: client delay before a request, set so that the generated gaps
            between requests (server time + think time) match the measured gaps,
            median 17 s (18 s between parent requests) and p90 128 s. The trace's own
            ``think_time`` field (median 10 s, p90 166 s) is not additive with its server
            time (its p90 exceeds the gap p90), so it is not used directly.
        compact_above_tokens: a turn that would take the context past this compacts it
            instead; measured: compactions start from a median of 152K and a p90 of
            165K input tokens (auto-compaction of a 200K-token window).
        long_window_share / long_window_compact_above_tokens: sessions run with a
            long window and compact later; measured: 23.6% of sessions exceed 200K
            tokens of context, the largest input is 880,502 tokens.
        compaction_ratio: context kept by a compaction; measured mean 0.3x.
        rerender_reset_per_turn: chance that a turn rewrites the history after the
            prefix at about the same size (a major reset that is not a compaction);
            measured 504 such resets over 36,781 parent turns after the first.
            Compactions and re-renders together give the share of sessions with a
            major reset (README 53.5%; 48.3% on the shared sessions).
        subagent_spawn_per_turn: measured 44 sub-agents over 37,311 parent requests.
        subagent_turns: measured median 10, p90 17 requests per sub-agent.
        subagent_first_tokens: measured sub-agent first input median 10,336, p90 11,758.
    """

    turns: LogNormal = field(default_factory=lambda: LogNormal.from_median_mean(47, 71.3))
    prefix_tokens: int = 14_948
    share_prefix: bool = True
    first_history_fresh: LogNormal = field(default_factory=lambda: LogNormal(6_000, 1.0))
    first_history_resumed: LogNormal = field(default_factory=lambda: LogNormal(200_000, 0.8))
    resumed_share: float = 0.25
    growth_tokens: LogNormal = field(
        default_factory=lambda: LogNormal.from_median_mean(10 * 64, 27.1 * 64))
    output_tokens: LogNormal = field(
        default_factory=lambda: LogNormal.from_median_mean(220, 443))
    think_time_s: LogNormal = field(default_factory=lambda: LogNormal.from_median_p90(7, 115))
    compact_above_tokens: int = 160_000
    long_window_share: float = 0.236
    long_window_compact_above_tokens: int = 800_000
    compaction_ratio: float = 0.3
    rerender_reset_per_turn: float = 504 / 36_781
    subagent_spawn_per_turn: float = 44 / 37_311
    subagent_turns: LogNormal = field(default_factory=lambda: LogNormal.from_median_p90(10, 17))
    subagent_first_tokens: LogNormal = field(
        default_factory=lambda: LogNormal.from_median_p90(10_336, 11_758))

    def __post_init__(self) -> None:
        for name in ("resumed_share", "long_window_share", "rerender_reset_per_turn",
                     "subagent_spawn_per_turn"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"AgentParams.{name} must be in [0, 1], got {v!r}")
        if self.prefix_tokens < 0:
            raise ValueError(f"AgentParams.prefix_tokens must be >= 0, got {self.prefix_tokens}")
        if not 0.0 < self.compaction_ratio <= 1.0:
            raise ValueError(
                f"AgentParams.compaction_ratio must be in (0, 1], got {self.compaction_ratio}")
        for name in ("compact_above_tokens", "long_window_compact_above_tokens"):
            v = getattr(self, name)
            if v <= 2 * self.prefix_tokens:
                raise ValueError(f"AgentParams.{name} must exceed twice prefix_tokens "
                                 f"({2 * self.prefix_tokens}), got {v}")


@dataclass(frozen=True, slots=True)
class ChatParams:
    """Chat sessions modelled on the Kimi chat trace (Mooncake conversation trace).

    Attributes:
        single_turn_share / multi_turn_mean: a session has one request with
            probability ``single_turn_share``, else a geometric number of requests
            (>= 2) with mean ``multi_turn_mean``. The trace has no sessions, so both are
            set so that the trace's infinite-cache hit rate (36.6%) and share of blocks
            used once (75.8%) come out of the generated chats.
        prefix_tokens: shared system prompt; README: 99.99% of requests share the first
            512-token block (id 0).
        first_message_tokens: first user message; its spread is fitted to the trace's
            input median 6,909 and p99 85,400 tokens, its median lowered to 6,000 so that
            with the later turns the input mean comes out near the trace's 12,035.
        followup_tokens: user text added per later turn (on top of the previous reply).
        output_tokens: fitted to the trace's output mean 343, p90 597.
        think_time_s: delay before the next turn; set so that the gap between turns
            (reply time + think time) matches the README reuse gap, median 113 s,
            p90 518 s.
    """

    single_turn_share: float = 0.77
    multi_turn_mean: float = 3.3
    prefix_tokens: int = 512
    first_message_tokens: LogNormal = field(
        default_factory=lambda: LogNormal(6_000, math.log(85_400 / 6_909) / 2.326))
    followup_tokens: LogNormal = field(default_factory=lambda: LogNormal(300, 1.0))
    output_tokens: LogNormal = field(default_factory=lambda: LogNormal.from_median_p90(300, 600))
    think_time_s: LogNormal = field(default_factory=lambda: LogNormal.from_median_p90(100, 500))

    def __post_init__(self) -> None:
        if not 0.0 <= self.single_turn_share <= 1.0:
            raise ValueError("ChatParams.single_turn_share must be in [0, 1], got "
                             f"{self.single_turn_share}")
        if self.multi_turn_mean < 2:
            raise ValueError(
                f"ChatParams.multi_turn_mean must be >= 2, got {self.multi_turn_mean}")
        if self.prefix_tokens < 0:
            raise ValueError(f"ChatParams.prefix_tokens must be >= 0, got {self.prefix_tokens}")

    @property
    def turns_mean(self) -> float:
        return self.single_turn_share + (1.0 - self.single_turn_share) * self.multi_turn_mean


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """What to generate. The default (32 agent sessions, about 2,300 requests and 4 M
    block accesses) replays in seconds; raise ``num_sessions`` for longer runs.

    Attributes:
        kind: ``"agent"``, ``"chat"`` or ``"mixed"`` (``chat_share`` of the sessions
            are chats, the rest agents; sessions are shuffled).
        num_sessions: sessions to generate.
        chat_share: fraction of chat sessions in a ``"mixed"`` workload.
        block_size_tokens: tokens per block (64 like the Claude Code trace).
        seed: seeds the random generator; the same spec gives the same trace.
    """

    kind: WorkloadKind = "agent"
    num_sessions: int = 32
    chat_share: float = 0.5
    block_size_tokens: int = 64
    seed: int = 0
    agent: AgentParams = field(default_factory=AgentParams)
    chat: ChatParams = field(default_factory=ChatParams)
    service: ServiceParams = field(default_factory=ServiceParams)

    def __post_init__(self) -> None:
        if self.kind not in WORKLOAD_KINDS:
            raise ValueError(f"WorkloadSpec.kind must be one of {WORKLOAD_KINDS}, "
                             f"got {self.kind!r}")
        if self.num_sessions <= 0:
            raise ValueError(f"WorkloadSpec.num_sessions must be > 0, got {self.num_sessions}")
        if not 0.0 <= self.chat_share <= 1.0:
            raise ValueError(f"WorkloadSpec.chat_share must be in [0, 1], got {self.chat_share}")
        if self.block_size_tokens <= 0:
            raise ValueError("WorkloadSpec.block_size_tokens must be > 0, got "
                             f"{self.block_size_tokens}")

    @property
    def num_chat_sessions(self) -> int:
        if self.kind == "chat":
            return self.num_sessions
        if self.kind == "agent":
            return 0
        return round(self.num_sessions * self.chat_share)


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
