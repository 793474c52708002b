"""Write-time placement (FC-GVA): a pure function from signals to a medium.

Each turn's new blocks get one home, decided once when they are written and never
changed. The rules are tried in this exact order (DESIGN.md); the first that matches
decides:

    rule             condition                                          medium
    MEMORY_FULL      host memory cannot take the segment                ssd
    SHARED_PREFIX    shared_refcount >= shared_refcount_threshold        memory
                     (e.g. a system prompt; a threshold of 0: never)
    NOT_YET          turn_index == 0, context_tokens <= agent threshold  memory, then
                     (``placement.not_yet``: no sign of reuse yet,        ssd when its
                     shared_refcount <= 1)                               session continues
    FIRST_TURN       turn_index == 0                                    ssd
    AGENT_CONTEXT    context_tokens > agent_context_threshold_tokens    ssd
    LONG_REPLY       prev_reply_tokens > long_reply_threshold_tokens    ssd
    SHORT_REPLY      prev_reply_tokens < short_reply_threshold_tokens   memory
    DEFAULT          otherwise                                          ssd

The reply rules only apply when a previous reply exists (``prev_reply_tokens`` is not
``None``); a later turn without one falls through to DEFAULT. With the shared-prefix rule
off (its default, ``PlacementConfig.shared_refcount_threshold``) a shared turn takes the
rules after it, except NOT_YET: it is reused already, so it is no candidate for deferral.

NOT_YET is the answer for a turn with no sign of reuse: a chat's first turn, shared by no
live request, below the agent threshold. Most are never read again (a chat that does not
continue), so writing them to the SSD wears the drive for nothing. The turn is homed in
host memory; when its session continues (the session's next store is an SSD write), the
control plane writes it to the SSD together with the new turn and frees the memory home
(``control.stores``). A turn whose memory home reclaim dropped before that is written
with the next turn all the same (its blocks are no longer indexed), and its hit in
between is a miss, never wrong bytes. When memory cannot take it, MEMORY_FULL sends it
to the SSD as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from flatcake.config import PlacementConfig
from flatcake.control.address import Medium


class PlacementRule(Enum):
    """The rule that decided a placement (for metrics and ``explain``)."""

    MEMORY_FULL = "memory_full"
    SHARED_PREFIX = "shared_prefix"
    NOT_YET = "not_yet"
    FIRST_TURN = "first_turn"
    AGENT_CONTEXT = "agent_context"
    LONG_REPLY = "long_reply"
    SHORT_REPLY = "short_reply"
    DEFAULT = "default"


@dataclass(frozen=True, slots=True)
class PlacementSignals:
    """What the engine knows before a turn runs.

    Attributes:
        memory_full: host memory cannot take this segment (the control plane computes
            it from the arena, after memory reclaim).
        shared_refcount: requests sharing these blocks (prefix-tree refcount); 1 when
            only this request uses them.
        turn_index: the session's turn, 0 for the first.
        context_tokens: tokens of context of this turn (history + new prompt).
        prev_reply_tokens: tokens of the previous turn's reply; ``None`` on the first
            turn or when unknown.
    """

    memory_full: bool
    shared_refcount: int
    turn_index: int
    context_tokens: int
    prev_reply_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("shared_refcount", "turn_index", "context_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"PlacementSignals.{name} must be an int >= 0, got {v!r}")
        p = self.prev_reply_tokens
        if p is not None and (not isinstance(p, int) or isinstance(p, bool) or p < 0):
            raise ValueError(
                f"PlacementSignals.prev_reply_tokens must be None or an int >= 0, got {p!r}"
            )


@dataclass(frozen=True, slots=True)
class Placement:
    """A placement decision and the rule that made it."""

    medium: Medium
    rule: PlacementRule


_MEMORY = Medium.MEMORY
_SSD = Medium.SSD
_DECISIONS = {
    PlacementRule.MEMORY_FULL: Placement(_SSD, PlacementRule.MEMORY_FULL),
    PlacementRule.SHARED_PREFIX: Placement(_MEMORY, PlacementRule.SHARED_PREFIX),
    PlacementRule.NOT_YET: Placement(_MEMORY, PlacementRule.NOT_YET),
    PlacementRule.FIRST_TURN: Placement(_SSD, PlacementRule.FIRST_TURN),
    PlacementRule.AGENT_CONTEXT: Placement(_SSD, PlacementRule.AGENT_CONTEXT),
    PlacementRule.LONG_REPLY: Placement(_SSD, PlacementRule.LONG_REPLY),
    PlacementRule.SHORT_REPLY: Placement(_MEMORY, PlacementRule.SHORT_REPLY),
    PlacementRule.DEFAULT: Placement(_SSD, PlacementRule.DEFAULT),
}


def placement_rule(signals: PlacementSignals, cfg: PlacementConfig) -> PlacementRule:
    """The first rule (in DESIGN.md order) that matches ``signals``."""
    if signals.memory_full:
        return PlacementRule.MEMORY_FULL
    # The threshold is 0 (off) or at least 2 (``PlacementConfig``).
    if cfg.shared_refcount_threshold and \
            signals.shared_refcount >= cfg.shared_refcount_threshold:
        return PlacementRule.SHARED_PREFIX
    shared = signals.shared_refcount > 1
    agent = signals.context_tokens > cfg.agent_context_threshold_tokens
    if signals.turn_index == 0:
        return PlacementRule.NOT_YET if cfg.not_yet and not agent and not shared else \
            PlacementRule.FIRST_TURN
    if agent:
        return PlacementRule.AGENT_CONTEXT
    reply = signals.prev_reply_tokens
    if reply is not None:
        if reply > cfg.long_reply_threshold_tokens:
            return PlacementRule.LONG_REPLY
        if reply < cfg.short_reply_threshold_tokens:
            return PlacementRule.SHORT_REPLY
    return PlacementRule.DEFAULT


def decide_placement(signals: PlacementSignals, cfg: PlacementConfig) -> Placement:
    """Where a turn's new blocks live, and why. Pure; never looks at anything else."""
    return _DECISIONS[placement_rule(signals, cfg)]


def explain(signals: PlacementSignals, cfg: PlacementConfig) -> str:
    """One line saying which rule fired and on which values, e.g.
    ``"ssd by agent_context: context_tokens=40000 > agent_context_threshold_tokens=32768"``.
    """
    decision = decide_placement(signals, cfg)
    rule = decision.rule
    s = signals
    why = {
        PlacementRule.MEMORY_FULL: "memory_full=True",
        PlacementRule.SHARED_PREFIX: (
            f"shared_refcount={s.shared_refcount} >= shared_refcount_threshold="
            f"{cfg.shared_refcount_threshold}"
        ),
        PlacementRule.NOT_YET: (
            f"turn_index=0, context_tokens={s.context_tokens} <= "
            f"agent_context_threshold_tokens={cfg.agent_context_threshold_tokens} (no sign "
            "of reuse yet: written to the SSD when the session continues)"
        ),
        PlacementRule.FIRST_TURN: "turn_index=0 (first turn of the session)",
        PlacementRule.AGENT_CONTEXT: (
            f"context_tokens={s.context_tokens} > agent_context_threshold_tokens="
            f"{cfg.agent_context_threshold_tokens}"
        ),
        PlacementRule.LONG_REPLY: (
            f"prev_reply_tokens={s.prev_reply_tokens} > long_reply_threshold_tokens="
            f"{cfg.long_reply_threshold_tokens}"
        ),
        PlacementRule.SHORT_REPLY: (
            f"prev_reply_tokens={s.prev_reply_tokens} < short_reply_threshold_tokens="
            f"{cfg.short_reply_threshold_tokens}"
        ),
        PlacementRule.DEFAULT: (
            "no earlier rule matched (prev_reply_tokens="
            f"{s.prev_reply_tokens} between the short and long reply thresholds or unknown)"
        ),
    }[rule]
    return f"{decision.medium.name.lower()} by {rule.value}: {why}"
