"""``analyze --plot``: reuse-distance CDF and session-size distribution (matplotlib).

matplotlib is imported here only, lazily, with the non-interactive Agg backend.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from flatcake.config import GIB
from flatcake.traces.analyze import CDF_POINTS, TraceAnalysis


def plot_analysis(analysis: TraceAnalysis, path: str | Path) -> Path:
    """Write a two-panel PNG (or any format matplotlib infers from ``path``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - matplotlib is in the plot extra
        raise ValueError("--plot needs matplotlib: pip install 'flatcake[plot]'") from exc
    st = analysis.stats
    fig, (ax_d, ax_s) = plt.subplots(1, 2, figsize=(11, 4.2))
    fig.suptitle(f"{st.trace} ({st.source_format}, {st.requests:,} requests) · "
                 f"{time.strftime('%Y-%m-%d')}")
    if len(analysis.reuse_distance_cdf):
        _reuse_distance(ax_d, analysis)
    else:
        ax_d.text(0.5, 0.5, "no block hashes:\nreuse distance unavailable",
                  ha="center", va="center", transform=ax_d.transAxes)
        ax_d.set_axis_off()
    if len(analysis.session_context_tokens):
        sizes = np.sort(analysis.session_context_tokens * st.kv_bytes_per_token / GIB)
        label = f"session KV (GiB, {st.model}, largest context)"
        title = f"session size ({st.sessions} sessions)"
    else:
        sizes = np.sort(analysis.input_tokens * st.kv_bytes_per_token / GIB)
        label = f"request KV (GiB, {st.model}); no sessions in this trace"
        title = "request size"
    if len(sizes):
        ax_s.step(sizes, np.arange(1, len(sizes) + 1) / len(sizes), where="post",
                  color="tab:green", label="share of sessions" if len(
                      analysis.session_context_tokens) else "share of requests")
        ax_s.legend(fontsize=8)
        if sizes[-1] > 0 and sizes[0] > 0 and sizes[-1] / sizes[0] > 100:
            ax_s.set_xscale("log")
    ax_s.set_xlabel(label)
    ax_s.set_ylabel("cumulative share")
    ax_s.set_title(title)
    ax_s.grid(True, alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _reuse_distance(ax: Any, analysis: TraceAnalysis) -> None:
    """The reuse-distance CDF; when most reuses sit at one distance (the Claude Code
    trace: nearly all at 1, so the CDF is a single step), the share of reuses *farther*
    than each distance on a log scale instead, which shows the tail the step hides."""
    st = analysis.stats
    d = np.maximum(analysis.reuse_distance_cdf, 0.5)
    q = np.linspace(0.0, 1.0, CDF_POINTS)
    order = "within-session" if st.clock == "session" else "global"
    ax.set_xlabel(f"reuse distance (requests, {order} order)")
    ax.set_xscale("log")
    ax.grid(True, alpha=0.3)
    lo, hi = np.searchsorted(q, [0.1, 0.9])
    if d[0] == d[-1]:  # a single distance: say it rather than draw a vertical line
        ax.bar([d[0]], [1.0], width=0.2 * d[0], color="tab:blue",
               label=f"all reuses at distance {d[0]:g}")
        ax.set_xlim(d[0] / 10, d[0] * 10)
        ax.set_ylabel("share of reuses")
        ax.set_title(f"every reuse is at distance {d[0]:g}"
                     + (" (the session's next request)" if d[0] == 1 else ""), fontsize=10)
    elif d[lo] == d[hi]:  # 80% of the mass at one distance: a CDF would be one step
        u = np.unique(d)
        farther = 1.0 - q[np.searchsorted(d, u, side="right") - 1]
        keep = farther > 0  # the largest distance has nothing beyond it (log scale)
        ax.step(u[keep], farther[keep], where="post", color="tab:blue", marker=".",
                label="share of reuses farther than d")
        ax.set_yscale("log")
        ax.set_ylabel("share of reuses at distance > d (log)")
        at = float(np.mean(analysis.reuse_distance_cdf == analysis.reuse_distance_cdf[hi]))
        ax.set_title(f"reuse distance tail: about {at:.0%} of reuses at distance "
                     f"{d[hi]:g}", fontsize=10)
    else:
        ax.step(d, q, where="post", color="tab:blue", label="share of reuses within d")
        ax.set_ylabel("share of reuses at distance <= d")
        ax.set_title(f"reuse distance CDF (median {st.reuse_distance_requests_median:g}, "
                     f"p90 {st.reuse_distance_requests_p90:g})", fontsize=10)
    ax.legend(fontsize=8)
