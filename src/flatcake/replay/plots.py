"""Sweep plots (matplotlib, imported lazily; without it, none: ``PLOT_EXTRA`` says how
to get it): hit rate vs load with the infinite-cache
line, TTFT mean and P99 vs load, SSD prefetch time vs load, read amplification.

Made to be read at a glance, without knowing the data:

* every system has its own colour, marker *and* line style, drawn largest marker first,
  so a series lying exactly on another still shows (a small filled marker inside a large
  hollow one) and the plots survive grey-scale printing;
* every panel has its own legend;
* what cannot be seen is said in a note under the panel: series drawn over each other
  (identical at every rate), series left out (no value at any rate, e.g. memory-only has
  no SSD prefetches), and panels where every line is the same constant;
* every figure is titled with the trace, the preset and the date of the sweep.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from flatcake.replay.results import SweepResult
from flatcake.replay.systems.registry import STYLES, Style

_OTHER = Style("black", "d", "-", 6, False)
MAX_LINE = {"color": "black", "linestyle": ":", "linewidth": 1.6}

PLOTS: tuple[tuple[str, tuple[tuple[str, str, float], ...]], ...] = (
    ("hit_rate.png", (("hit_rate_gpu", "hit rate delivered to the GPU (%)", 100.0),)),
    ("ttft.png", (("ttft_mean_s", "mean TTFT (s)", 1.0), ("ttft_p99_s", "P99 TTFT (s)", 1.0))),
    ("prefetch.png", (("prefetch_time_mean_s", "SSD prefetch time, mean (s)", 1.0),)),
    ("read_amplification.png",
     (("read_amplification", "SSD bytes read per restored byte", 1.0),)),
)
"""File name and panels (metric, axis label, scale) of every figure ``write_plots``
draws, in order."""

PLOT_EXTRA = "plots need matplotlib: pip install 'flatcake[plot]'"


def matplotlib_missing() -> str | None:
    """``PLOT_EXTRA`` when matplotlib cannot be imported (the ``plot`` extra is not
    installed), else None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return PLOT_EXTRA
    return None


def series(result: SweepResult, system: str, key: str, scale: float = 1.0
           ) -> tuple[list[float], list[float]]:
    """(rates, values) of ``system`` for ``key``, leaving out missing and non-finite values."""
    xs, ys = [], []
    for r in result.by(system):
        v = r.get(key)
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            continue
        xs.append(r["rate_req_s"])
        ys.append(v * scale)
    return xs, ys


def _same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)
                                    for x, y in zip(a, b, strict=True))


def panel_notes(result: SweepResult, key: str, scale: float = 1.0) -> list[str]:
    """What a reader cannot see on the panel of ``key``: omitted, hidden, constant series."""
    systems = result.meta["systems"]
    data = {s: series(result, s, key, scale) for s in systems}
    drawn = [s for s in systems if data[s][0]]
    notes = []
    missing = [s for s in systems if not data[s][0]]
    if missing:
        notes.append(f"not shown (no value at any rate): {', '.join(missing)}")
    rates = sorted({r["rate_req_s"] for r in result.runs})
    for s in drawn:
        gaps = [r for r in rates if r not in data[s][0]]
        if gaps:
            notes.append(f"{s} has no value at {', '.join(f'{r:g}' for r in gaps)} req/s")
    values = [y for s in drawn for y in data[s][1]]
    if len(drawn) > 1 and values and all(math.isclose(y, values[0]) for y in values):
        notes.append(f"{', '.join(drawn)} are all {values[0]:.4g} wherever they have a "
                     "value: the lines lie on each other")
        return notes
    seen: list[str] = []
    for s in drawn:
        twin = next((t for t in seen if data[t][0] == data[s][0]
                     and _same(data[t][1], data[s][1])), None)
        if twin is not None:
            notes.append(f"{s} equals {twin} at every rate (drawn over it)")
        else:
            seen.append(s)
    return notes


def title(result: SweepResult) -> str:
    meta = result.meta
    when = meta.get("date") or time.strftime("%Y-%m-%d")
    return f"{meta['trace']} · preset {meta['preset']} · {when}"


def _draw(ax: Any, result: SweepResult, key: str, label: str, scale: float) -> None:
    systems = result.meta["systems"]
    # Largest markers first, so smaller ones stay visible on top of them.
    for s in sorted(systems, key=lambda n: -STYLES.get(n, _OTHER).markersize):
        st = STYLES.get(s, _OTHER)
        xs, ys = series(result, s, key, scale)
        if xs:
            ax.plot(xs, ys, color=st.color, marker=st.marker, linestyle=st.linestyle,
                    markersize=st.markersize, linewidth=1.8,
                    markerfacecolor="none" if st.hollow else st.color,
                    markeredgewidth=1.6, label=s, zorder=2 + systems.index(s))
    if key == "hit_rate_gpu" and systems:
        xs, ys = series(result, systems[0], "max_hit_rate", scale)
        ax.plot(xs, ys, label="max (∞ cache)", zorder=1, **MAX_LINE)
    ax.set_xlabel("load (requests/s)")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    # Keep the legend in the order the sweep lists the systems.
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: (
        systems.index(labels[i]) if labels[i] in systems else len(systems)))
    if handles:
        ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=8)
    notes = panel_notes(result, key, scale)
    if notes:
        ax.text(0.0, -0.2, "\n".join(f"note: {n}" for n in notes), transform=ax.transAxes,
                va="top", ha="left", fontsize=7.5, color="dimgray")


def figure(result: SweepResult, panels: tuple[tuple[str, str, float], ...]) -> Any:
    """One matplotlib figure with a panel per (metric, label, scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 4.6), squeeze=False)
    for ax, (key, label, scale) in zip(axes[0], panels, strict=True):
        _draw(ax, result, key, label, scale)
    fig.suptitle(title(result), fontsize=9)
    fig.tight_layout()
    return fig


def write_plots(result: SweepResult, out: str | Path) -> list[Path]:
    """Write the figures of ``PLOTS`` into ``out``; returns their paths (none without
    matplotlib: ``matplotlib_missing``)."""
    if matplotlib_missing():
        return []
    import matplotlib.pyplot as plt

    paths: list[Path] = []
    for name, panels in PLOTS:
        fig = figure(result, panels)
        paths.append(Path(out) / name)
        fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
        plt.close(fig)
    return paths
