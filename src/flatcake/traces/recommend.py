"""What a team should do with its trace: the recommendation section of ``analyze``.

Pure functions of the analysis, a model geometry, a memory budget and the current
placement thresholds, so the advice is testable and the CLI only prints it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flatcake.config import GIB, PlacementConfig
from flatcake.geometry import KVGeometry
from flatcake.traces.analyze import TraceAnalysis

DEFAULT_SSD_READ_GBPS = 5.0
"""Per-worker SSD read bandwidth the paper measures for FlatCake (DESIGN.md)."""


@dataclass(frozen=True, slots=True)
class Recommendation:
    """Advice lines plus the placement thresholds they suggest.

    Attributes:
        lines: sentences a user can act on, in print order.
        placement: suggested ``[placement]`` config values (``PlacementConfig`` fields).
        sessions_in_memory: average sessions the memory budget holds (None without
            sessions).
        ssd_on_read_path: True when the trace has more sessions than memory holds, so
            restores will read the SSD (None without sessions).
    """

    lines: tuple[str, ...]
    placement: dict[str, int]
    sessions_in_memory: int | None
    ssd_on_read_path: bool | None

    def to_dict(self) -> dict[str, object]:
        return {"lines": list(self.lines), "placement": dict(self.placement),
                "sessions_in_memory": self.sessions_in_memory,
                "ssd_on_read_path": self.ssd_on_read_path}


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / GIB:.2f} GiB"


def recommend(analysis: TraceAnalysis, geometry: KVGeometry, memory_bytes: int,
              placement: PlacementConfig, *, memory_sessions: int = 16,
              ssd_read_gbps: float = DEFAULT_SSD_READ_GBPS) -> Recommendation:
    """Turn an analysis into advice for a host-memory budget of ``memory_bytes``.

    ``memory_sessions`` is how many agent sessions memory should keep at once; it sets
    the suggested ``agent_context_threshold_tokens``.
    """
    if memory_bytes <= 0:
        raise ValueError(f"memory_bytes must be > 0, got {memory_bytes}")
    if memory_sessions <= 0:
        raise ValueError(f"memory_sessions must be > 0, got {memory_sessions}")
    if ssd_read_gbps <= 0:
        raise ValueError(f"ssd_read_gbps must be > 0, got {ssd_read_gbps}")
    st = analysis.stats
    bpt = geometry.bytes_per_token
    lines: list[str] = []
    if not st.has_hashes:
        lines.append("This trace has no block hashes: prefix statistics are unavailable. "
                     "Use it for arrival times and request lengths only.")
    else:
        hit = st.max_prefix_hit_rate or 0.0
        lines.append(
            f"An infinite cache would serve {hit:.1%} of block accesses "
            f"({(st.max_prefix_hit_rate_tokens or 0.0):.1%} of input tokens): this is the "
            "ceiling for any KV store on this trace.")
        once = st.share_blocks_used_once or 0.0
        if once > 0.5:
            lines.append(
                f"{once:.0%} of blocks are used exactly once: admitting every new block "
                "into memory (LRU) fills it with blocks nobody reads again. Keep memory for "
                "shared prefixes and short chat turns and write the rest straight to SSD "
                "(FlatCake's write-time placement).")
        else:
            lines.append(
                f"Only {once:.0%} of blocks are used exactly once: nearly all KV written is "
                "read again, so keep every block (memory or SSD) instead of recomputing it.")
    sessions_in_memory: int | None = None
    ssd_on_read_path: bool | None = None
    mem = _gib(memory_bytes)
    if st.sessions and st.session_kv_bytes_mean:
        kv_mean = st.session_kv_bytes_mean
        kv_p99 = st.session_kv_bytes_p99 or kv_mean
        sessions_in_memory = int(memory_bytes // kv_mean)
        ssd_on_read_path = sessions_in_memory < st.sessions
        lines.append(
            f"Sessions average {_gib(kv_mean)} of KV on {geometry.name} (p99 {_gib(kv_p99)}); "
            f"{mem} of memory holds {sessions_in_memory} average sessions "
            f"({int(memory_bytes // kv_p99)} at p99).")
        restore_s = kv_mean / (ssd_read_gbps * 1e9)
        if sessions_in_memory == 0:
            lines.append(
                f"Memory cannot hold one average session: every restore reads the SSD. An "
                f"average restore reads {_gib(kv_mean)}, {restore_s:.2f} s at "
                f"{ssd_read_gbps:g} GB/s per worker: read each session contiguously in few "
                "large reads.")
        elif ssd_on_read_path:
            lines.append(
                f"With more than {sessions_in_memory} of its {st.sessions} sessions live at "
                "once, restores come from SSD: expect the SSD on the read path. An average "
                f"restore reads {_gib(kv_mean)}, {restore_s:.2f} s at {ssd_read_gbps:g} GB/s "
                "per worker: read each session contiguously in few large reads.")
        else:
            lines.append(f"Memory holds all {st.sessions} sessions of this trace: the SSD is "
                         "a capacity backstop, not on the read path.")
    else:
        p99_bytes = st.input_tokens_p99 * bpt
        lines.append(f"A p99 request ({st.input_tokens_p99:,.0f} tokens) carries "
                     f"{_gib(p99_bytes)} of KV on {geometry.name}; {mem} of memory holds "
                     f"{int(memory_bytes // max(p99_bytes, 1))} of them.")
    if st.reuse_gap_seconds_median is not None:
        text = (f"Half of all reuses come back within {st.reuse_gap_seconds_median:.0f} s "
                f"(p90 {st.reuse_gap_seconds_p90:.0f} s)")
        if st.time_span_s and st.unique_blocks:
            write_rate = st.unique_blocks * st.block_size_tokens * bpt / st.time_span_s
            hold = write_rate * (st.reuse_gap_seconds_p90 or 0.0)
            text += (f"; new KV arrives at {_gib(write_rate)}/s, so keeping the p90 reuse "
                     f"in an LRU memory takes about {_gib(hold)}")
        elif st.clock == "session":
            text += " on each session's own clock"
        lines.append(text + ".")
    # Placement thresholds.
    bs = geometry.tokens_per_block
    threshold = max(bs, int(memory_bytes // (memory_sessions * bpt)) // bs * bs)
    contexts = (analysis.session_context_tokens if st.sessions
                else analysis.input_tokens)
    over = float(np.mean(contexts > threshold)) if len(contexts) else 0.0
    what = "sessions" if st.sessions else "requests"
    lines.append(
        f"Suggested agent_context_threshold_tokens = {threshold}: memory then keeps "
        f"{memory_sessions} sessions of up to that context; {over:.0%} of this trace's {what} "
        "are longer and go to SSD.")
    outs = analysis.output_tokens
    if len(outs):
        short = float(np.mean(outs <= placement.short_reply_threshold_tokens))
        long = float(np.mean(outs > placement.long_reply_threshold_tokens))
        chat = (f"{short:.0%} of replies are at most short_reply_threshold_tokens = "
                f"{placement.short_reply_threshold_tokens} (chat turns, kept in memory)"
                if placement.short_reply_threshold_tokens else
                "short_reply_threshold_tokens = 0: chat turns are homed on SSD and served "
                "from their memory copies while memory has room ('flatcake tune' says "
                "whether homing them in memory pays on this trace)")
        lines.append(
            f"{chat}; {long:.0%} exceed long_reply_threshold_tokens = "
            f"{placement.long_reply_threshold_tokens} (written to SSD).")
    suggested = {
        "agent_context_threshold_tokens": threshold,
        "short_reply_threshold_tokens": placement.short_reply_threshold_tokens,
        "long_reply_threshold_tokens": placement.long_reply_threshold_tokens,
    }
    return Recommendation(lines=tuple(lines), placement=suggested,
                          sessions_in_memory=sessions_in_memory,
                          ssd_on_read_path=ssd_on_read_path)
