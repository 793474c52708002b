"""What the built-in workload generator draws from: distributions and the agent, chat
and service parameters, each sourced from the public traces (``traces.generator``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Literal

import numpy as np

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
            (reply time + think time) matches the Mooncake conversation trace's reuse gap
            (docs/usage/traces.md), median 113 s,
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
