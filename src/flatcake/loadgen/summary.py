"""The summary of a run: TTFT percentiles, the cached share, throughput, errors.

Over the successful requests::

    ttft p50 / p95 / p99 / mean    time to the first streamed token (s)
    cached share                   sum(cached_tokens) / sum(prompt_tokens), as the server
                                   reports them (None when it reports no cached_tokens)
    reusable share                 sum(reusable_tokens) / sum(prompt_tokens): what an
                                   infinite prefix cache could have served
    cached of reusable             cached / reusable: how much of that the server served
    req/s                          successful requests / wall time of the run

Percentiles interpolate linearly between order statistics (numpy's default), so the
p50 of two values is their mean.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from flatcake.loadgen.driver import Record

CACHED_MISSING = ("the server reported no usage.prompt_tokens_details.cached_tokens; "
                  "start vLLM with --enable-prompt-tokens-details to see cache hits")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linearly interpolated."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


@dataclass(frozen=True, slots=True)
class Summary:
    """A run's figures (times in seconds, shares in [0, 1]; None where undefined)."""

    requests: int
    ok: int
    errors: int
    wall_s: float
    req_per_s: float
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    ttft_mean_s: float | None
    e2e_p50_s: float | None
    e2e_mean_s: float | None
    prompt_tokens: int
    cached_tokens: int | None
    reusable_tokens: int
    cached_share: float | None
    reusable_share: float | None
    cached_of_reusable: float | None
    output_tokens_per_s: float
    error_examples: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["error_examples"] = list(self.error_examples)
        return d


def summarize(records: Sequence[Record], wall_s: float) -> Summary:
    """The summary of ``records`` over a run of ``wall_s`` seconds."""
    ok = [r for r in records if r.reply.ok]
    ttft = [r.reply.ttft_s for r in ok if r.reply.ttft_s is not None]
    e2e = [r.reply.e2e_s for r in ok if r.reply.e2e_s is not None]
    # The server's count when it gives one (it may add a BOS token), else what was sent.
    prompt = [r.reply.prompt_tokens if r.reply.prompt_tokens is not None
              else r.prompt_tokens_sent for r in ok]
    reported = [r.reply.cached_tokens for r in ok if r.reply.cached_tokens is not None]
    cached = sum(reported) if reported else None
    reusable = sum(r.reusable_tokens for r in ok)
    examples = tuple(dict.fromkeys(str(r.reply.error) for r in records
                                   if not r.reply.ok))[:3]
    out_tokens = sum(r.reply.completion_tokens or 0 for r in ok)
    return Summary(
        requests=len(records), ok=len(ok), errors=len(records) - len(ok), wall_s=wall_s,
        req_per_s=len(ok) / wall_s if wall_s > 0 else 0.0,
        ttft_p50_s=percentile(ttft, 50) if ttft else None,
        ttft_p95_s=percentile(ttft, 95) if ttft else None,
        ttft_p99_s=percentile(ttft, 99) if ttft else None,
        ttft_mean_s=sum(ttft) / len(ttft) if ttft else None,
        e2e_p50_s=percentile(e2e, 50) if e2e else None,
        e2e_mean_s=sum(e2e) / len(e2e) if e2e else None,
        prompt_tokens=sum(prompt), cached_tokens=cached, reusable_tokens=reusable,
        cached_share=None if cached is None else _ratio(cached, sum(prompt)),
        reusable_share=_ratio(reusable, sum(prompt)),
        cached_of_reusable=None if cached is None else _ratio(cached, reusable),
        output_tokens_per_s=out_tokens / wall_s if wall_s > 0 else 0.0,
        error_examples=examples)


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f} s"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def rows(s: Summary) -> list[tuple[str, str]]:
    """The summary's lines: (what, value), as the table and the page show them."""
    return [
        ("requests", f"{s.requests} ({s.ok} ok, {s.errors} failed)"),
        ("wall time", f"{s.wall_s:.1f} s"),
        ("throughput", f"{s.req_per_s:.2f} req/s, {s.output_tokens_per_s:.1f} output tok/s"),
        ("TTFT p50 / p95 / p99", f"{_s(s.ttft_p50_s)} / {_s(s.ttft_p95_s)} / "
                                 f"{_s(s.ttft_p99_s)}"),
        ("TTFT mean", _s(s.ttft_mean_s)),
        ("end-to-end p50 / mean", f"{_s(s.e2e_p50_s)} / {_s(s.e2e_mean_s)}"),
        ("prompt tokens", f"{s.prompt_tokens:,}"),
        ("cached share", _pct(s.cached_share) + (
            f" ({s.cached_tokens:,} tokens)" if s.cached_tokens is not None else "")),
        ("reusable share", _pct(s.reusable_share) + (
            " (what an infinite prefix cache serves)" if s.reusable_share is not None else "")),
        ("cached of reusable", _pct(s.cached_of_reusable)),
    ]


def notes(s: Summary) -> list[str]:
    """What the numbers need said beside them: a server that reports no cached
    tokens, and examples of the errors."""
    out = [f"note: {CACHED_MISSING}"] if s.ok and s.cached_tokens is None else []
    return out + [f"error: {e}" for e in s.error_examples]


def table(s: Summary) -> str:
    """The summary as an aligned two-column table."""
    lines = rows(s)
    width = max(len(k) for k, _ in lines)
    return "\n".join([f"{k:<{width}}  {v}" for k, v in lines] + notes(s))


def markdown(s: Summary) -> str:
    """The summary as a Markdown table (``report.html``)."""
    body = [f"| {k} | {v} |" for k, v in rows(s)]
    return "\n".join(["| metric | value |", "|---|---|", *body, "", *notes(s)])
