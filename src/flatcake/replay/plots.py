"""Sweep plots (matplotlib, imported lazily): hit rate vs load with the infinite-cache
line, TTFT mean and P99 vs load, SSD prefetch time vs load, read amplification."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from flatcake.replay.sweep import SweepResult

_STYLE = {
    "flatcake": ("tab:blue", "o", "-"),
    "flatcake-1q": ("tab:cyan", "o", "--"),
    "tiered": ("tab:red", "s", "-"),
    "tiered-direct": ("tab:orange", "s", "--"),
    "memory-only": ("tab:gray", "^", "-"),
}


def _series(result: SweepResult, system: str, key: str, scale: float = 1.0
            ) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in result.by(system):
        v = r.get(key)
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            continue
        xs.append(r["rate_req_s"])
        ys.append(v * scale)
    return xs, ys


def write_plots(result: SweepResult, out: str | Path) -> list[Path]:
    """Write ``hit_rate.png``, ``ttft.png``, ``prefetch.png``, ``read_amplification.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    systems = result.meta["systems"]
    title = f"{result.meta['trace']} · preset {result.meta['preset']}"
    paths: list[Path] = []

    def plot(ax: Any, key: str, scale: float = 1.0) -> None:
        for s in systems:
            color, marker, ls = _STYLE.get(s, ("black", "x", "-"))
            xs, ys = _series(result, s, key, scale)
            if xs:
                ax.plot(xs, ys, marker=marker, linestyle=ls, color=color, label=s)
        ax.set_xlabel("load (requests/s)")
        ax.grid(alpha=0.3)

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    plot(ax, "hit_rate_gpu", 100.0)
    first = systems[0] if systems else None
    if first is not None:
        xs, ys = _series(result, first, "max_hit_rate", 100.0)
        ax.plot(xs, ys, color="black", linestyle=":", label="max (∞ cache)")
    ax.set_ylabel("hit rate delivered to the GPU (%)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    paths.append(out / "hit_rate.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.0))
    plot(axes[0], "ttft_mean_s")
    axes[0].set_ylabel("mean TTFT (s)")
    plot(axes[1], "ttft_p99_s")
    axes[1].set_ylabel("P99 TTFT (s)")
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    paths.append(out / "ttft.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    plot(ax, "prefetch_time_mean_s")
    ax.set_ylabel("SSD prefetch time, mean (s)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    paths.append(out / "prefetch.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    plot(ax, "read_amplification")
    ax.set_ylabel("SSD bytes read per restored byte")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    paths.append(out / "read_amplification.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths
