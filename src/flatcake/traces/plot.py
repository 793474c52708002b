"""``analyze --plot``: reuse-distance CDF and session-size distribution (matplotlib).

matplotlib is imported here only, lazily, with the non-interactive Agg backend.
"""

from __future__ import annotations

from pathlib import Path

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
    fig.suptitle(f"{st.trace} ({st.source_format}, {st.requests:,} requests)")
    if len(analysis.reuse_distance_cdf):
        q = np.linspace(0.0, 1.0, CDF_POINTS)
        ax_d.step(np.maximum(analysis.reuse_distance_cdf, 0.5), q, where="post")
        ax_d.set_xscale("log")
        order = "within-session" if st.clock == "session" else "global"
        ax_d.set_xlabel(f"reuse distance (requests, {order} order)")
        ax_d.set_ylabel("share of reuses")
        ax_d.set_title(f"reuse distance CDF (median {st.reuse_distance_requests_median:g}, "
                       f"p90 {st.reuse_distance_requests_p90:g})")
        ax_d.grid(True, alpha=0.3)
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
        ax_s.step(sizes, np.arange(1, len(sizes) + 1) / len(sizes), where="post")
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
