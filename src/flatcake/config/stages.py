"""The sections of the books and their planners: placement, reclaim, read planning
and FC-MAS restore scheduling."""

from __future__ import annotations

from dataclasses import dataclass

from flatcake.config.checks import KIB, MIB, check, check_types


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    """Write-time placement thresholds (FC-GVA); see ``control.placement`` for the rule order.

    Defaults come from the shared traces: chat replies are short (Azure conv mean output
    211 tokens, Kimi chat 343), agent turns carry long histories (Claude Code mean input
    121K tokens, median session context 148K), so 32K tokens of context already marks an
    agent session whose KV (4 GiB on Llama-3.1-8B) no host arena holds for long.

    Defaults measured with the replay (README, "Placement defaults"): copies on at 0.9,
    and the short-reply rule off (0). With copies, a chat turn homed on SSD is served
    from memory while memory has room, like one homed in memory, and stays a hit when
    memory fills; a turn homed in memory is then dropped (reclaim never writes back),
    which cost 0.4 points of hit rate on the Mooncake chat trace against tiered LRU
    demotion. ``flatcake tune`` turns the rule back on where it pays.
    """

    agent_context_threshold_tokens: int = 32 * 1024
    """A turn whose context reaches this many tokens is an agent turn: homed on the SSD."""
    long_reply_threshold_tokens: int = 2048
    """A previous reply this long or longer marks a session whose next turn goes to SSD."""
    short_reply_threshold_tokens: int = 0
    """A previous reply this short keeps the next turn in memory; 0 turns the rule off."""
    shared_refcount_threshold: int = 0
    """A turn whose first new block this many live requests hold or more (this one
    included: a system prompt, a retried or duplicated prompt) is homed in memory; 2 (any
    sharing) is the paper's rule, 0 turns it off. Off by default for the reason the
    short-reply rule is: with copies a shared turn homed on SSD is served from its copy
    while memory has room and stays a hit when memory fills, whereas reclaim drops a turn
    homed in memory (Mooncake chat trace at 8 req/s: 56 such turns dropped, 0.17 points
    of hit rate below tiered-direct's)."""
    memory_copy_watermark: float = 0.9
    """Spare host memory: an SSD-homed turn also gets a memory copy (clean: never written
    back, dropped before any memory-homed segment under pressure; its home and address do
    not change) while host memory use, copy included, stays at or under this fraction of
    the arena; restores read the copy. 0 turns copies off."""
    copy_on_restore: bool = False
    """A restore that reads a whole SSD segment (one with no copy) also gets a memory copy
    of it under the same watermark, written from the verified restored blocks, so the
    session's next turn reads host memory. Each layer is copied as it lands, overlapping
    the next layer's reads, and the request waits for the last layer's copy (the replay
    charges the same). Off by default (README, "Placement defaults")."""
    branch_tail_tokens: int = 32 * 1024
    """A request without a ``session_id`` that shares only part of a stored session (a
    retry, a sub-agent, another question) is a branch: its new blocks append to the
    session owning the block it branches from, up to this many tokens of branch tails per
    session, then to an heir session under the same cap (``control.signals``)."""
    not_yet: bool = False
    """A first turn below the agent threshold that no live request shares is homed in host
    memory and written to the SSD only when its session continues (NOT_YET), so a chat that
    ends after one turn costs no SSD wear; false sends it to the SSD at once."""
    not_yet_write_back: bool = False
    """With ``not_yet``: memory reclaim takes the not-yet homes before anything else in
    host memory (memory copies of SSD turns included), oldest session first, and writes
    each one whose session may still continue to the SSD from host memory (its home freed
    once durable) instead of dropping it. The replay, the embedded store and the embedded
    vLLM connector (its workers, from their arenas) write them; the node service does not
    move KV bytes and refuses it."""
    not_yet_idle_s: float = 0.0
    """With ``not_yet_write_back``: a not-yet home whose session has been idle longer
    than this many seconds is dropped unwritten at reclaim (its chat taken as over); 0
    writes every one."""

    def __post_init__(self) -> None:
        check_types(self, "placement")
        for name in (
            "agent_context_threshold_tokens",
            "branch_tail_tokens",
            "long_reply_threshold_tokens",
            "short_reply_threshold_tokens",
            "shared_refcount_threshold",
        ):
            v = getattr(self, name)
            check(isinstance(v, int) and v >= 0, f"placement.{name}", v, "must be an int >= 0")
        check(self.shared_refcount_threshold != 1, "placement.shared_refcount_threshold",
               self.shared_refcount_threshold,
               "must be 0 (off) or at least 2 (every turn is held by its own request)")
        i = self.not_yet_idle_s
        check(isinstance(i, (int, float)) and not isinstance(i, bool) and i >= 0,
               "placement.not_yet_idle_s", i, "must be a number >= 0")
        w = self.memory_copy_watermark
        check(isinstance(w, (int, float)) and not isinstance(w, bool) and 0.0 <= w <= 1.0,
               "placement.memory_copy_watermark", w, "must be a number in [0, 1]")
        check(
            self.short_reply_threshold_tokens <= self.long_reply_threshold_tokens,
            "placement.short_reply_threshold_tokens",
            self.short_reply_threshold_tokens,
            "must not exceed long_reply_threshold_tokens",
        )


@dataclass(frozen=True, slots=True)
class ReclaimConfig:
    """Watermarks as fractions of each medium's capacity: reclaim starts when use crosses
    ``*_high`` and drops whole sessions, oldest last access first, until use is at or
    under ``*_low``."""

    ssd_high: float = 0.90
    """SSD use (fraction of ``store.ssd_capacity_bytes``) that starts a reclaim."""
    ssd_low: float = 0.80
    """SSD use a reclaim brings the store back to."""
    memory_high: float = 0.90
    """Host memory use (fraction of ``store.memory_capacity_bytes``) that starts a reclaim."""
    memory_low: float = 0.80
    """Host memory use a reclaim brings the store back to."""

    def __post_init__(self) -> None:
        check_types(self, "reclaim")
        for medium in ("ssd", "memory"):
            hi, lo = getattr(self, f"{medium}_high"), getattr(self, f"{medium}_low")
            check(0.0 < hi <= 1.0, f"reclaim.{medium}_high", hi, "must be in (0, 1]")
            check(0.0 <= lo < hi, f"reclaim.{medium}_low", lo, f"must be in [0, {medium}_high)")


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    """Read planning (FC-CIO)."""

    gap_limit_bytes: int = 64 * KIB
    """Read through holes smaller than this between two wanted ranges of one file (the
    paper uses 64 KiB)."""
    max_read_bytes: int = 64 * MIB
    """Split merged reads larger than this, so several commands stay in flight."""

    def __post_init__(self) -> None:
        check_types(self, "planner")
        check(self.gap_limit_bytes >= 0, "planner.gap_limit_bytes", self.gap_limit_bytes,
               "must be >= 0")
        check(self.max_read_bytes >= 4 * KIB and self.max_read_bytes % (4 * KIB) == 0,
               "planner.max_read_bytes", self.max_read_bytes,
               "must be a positive multiple of 4096")

@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """FC-MAS restore scheduling."""

    max_restores_in_flight: int = 2
    """SSD restores holding a staging window (two layers per stream) at once; further
    restores wait for a slot, never cancel."""
    single_queue: bool = False
    """The one-FIFO-queue ablation of FC-MAS."""

    def __post_init__(self) -> None:
        check_types(self, "scheduler")
        check(self.max_restores_in_flight >= 1, "scheduler.max_restores_in_flight",
               self.max_restores_in_flight, "must be >= 1")

