"""Sweep plots a reader can read and the one-page ``report.html``: every system
distinguishable, a legend on every panel, notes for what the eye cannot see, and a
page whose tables are the sweep's own."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from flatcake.replay.page import markdown_to_html, render
from flatcake.replay.plots import PLOTS, STYLES, figure, panel_notes, title
from flatcake.replay.results import SweepResult, markdown
from flatcake.replay.sweep import run_sweep
from flatcake.replay.workload.source import load_workload

SYSTEMS = ["flatcake", "flatcake-1q", "tiered", "tiered-direct", "memory-only"]
RATES = [0.1, 0.5, 1.0]


def _run(system: str, rate: float, **metrics: Any) -> dict[str, Any]:
    base = {"system": system, "rate_req_s": rate, "hit_rate_gpu": 0.9, "max_hit_rate": 0.95,
            "ttft_mean_s": 0.3, "ttft_p99_s": 5.0, "prefetch_time_mean_s": 0.02,
            "read_amplification": 1.0, "wall_s": 1.0, "prefetch_time_p99_s": 0.1,
            "ssd_read_gbps_per_worker": 5.0, "prefetch_cancellations": 0,
            "throughput_req_s": 0.1}
    return {**base, **metrics}


def _result() -> SweepResult:
    """flatcake-1q equals flatcake, memory-only has no prefetches, every read
    amplification is 1, tiered has no prefetch at the lowest rate."""
    runs = []
    for r in RATES:
        runs.append(_run("flatcake", r, hit_rate_gpu=0.94, ttft_mean_s=0.2 + r))
        runs.append(_run("flatcake-1q", r, hit_rate_gpu=0.94, ttft_mean_s=0.2 + r))
        runs.append(_run("tiered", r, hit_rate_gpu=0.9 - r / 10, ttft_mean_s=0.4 + r,
                         prefetch_time_mean_s=None if r == 0.1 else 0.1))
        runs.append(_run("tiered-direct", r, ttft_mean_s=0.3 + r))
        runs.append(_run("memory-only", r, hit_rate_gpu=0.8, prefetch_time_mean_s=None,
                         read_amplification=math.nan))
    meta = {"systems": SYSTEMS, "rates": RATES, "trace": "t", "preset": "paper",
            "date": "2026-12-02 21:00", "workload": "w", "seed": 0, "jobs": 1, "wall_s": 1.0,
            "run_wall_s_max": 1.0, "assumptions": ["an <assumption>"]}
    return SweepResult(runs, meta)


def test_every_system_has_its_own_marker_and_line_style() -> None:
    from flatcake.replay.systems import ALL_SYSTEMS

    assert set(ALL_SYSTEMS) <= set(STYLES)  # every registry entry has a style
    assert len({s.marker for s in STYLES.values()}) == len(STYLES)
    assert len({str(s.linestyle) for s in STYLES.values()}) >= len(STYLES) - 1
    assert len({s.color for s in STYLES.values()}) == len(STYLES)


def test_notes_say_what_cannot_be_seen() -> None:
    res = _result()
    hit = panel_notes(res, "hit_rate_gpu", 100.0)
    assert hit == ["flatcake-1q equals flatcake at every rate (drawn over it)"]
    pre = panel_notes(res, "prefetch_time_mean_s")
    assert "not shown (no value at any rate): memory-only" in pre
    assert "tiered has no value at 0.1 req/s" in pre
    amp = panel_notes(res, "read_amplification")
    assert amp[-1].startswith("flatcake, flatcake-1q, tiered, tiered-direct are all 1 ")
    assert panel_notes(res, "ttft_p99_s")[-1].endswith("the lines lie on each other")


def test_every_panel_has_a_legend_title_and_notes() -> None:
    import matplotlib.pyplot as plt

    res = _result()
    for _, panels in PLOTS:
        fig = figure(res, panels)
        try:
            assert fig._suptitle.get_text() == title(res) == "t · preset paper · 2026-12-02 21:00"
            for ax, (key, _, _) in zip(fig.axes, panels, strict=True):
                labels = [t.get_text() for t in ax.get_legend().get_texts()]
                drawn = [s for s in SYSTEMS if s not in ("memory-only",)
                         or key not in ("prefetch_time_mean_s", "read_amplification")]
                assert labels[:len(drawn)] == drawn
                if key == "hit_rate_gpu":
                    assert labels[-1] == "max (∞ cache)"
                texts = " ".join(t.get_text() for t in ax.texts)
                assert all(n in texts for n in panel_notes(res, key))
        finally:
            plt.close(fig)


def test_markdown_tables_become_html_tables() -> None:
    got = markdown_to_html("# A `b`\n\ntext <x>\n\n| r | s |\n|---:|---:|\n| 0.1 | 9.50 |\n")
    assert got == ("<h1>A <code>b</code></h1>\n<p>text &lt;x&gt;</p>\n"
                   "<table><tr><th>r</th><th>s</th></tr>\n"
                   '<tr><td class="n">0.1</td><td class="n">9.50</td></tr>\n</table>')


def test_report_html_holds_the_sweep_tables_and_plots(tmp_path: Path) -> None:
    wl, _ = load_workload(None, sessions=2)
    res = run_sweep(wl, ["flatcake", "memory-only"], [0.5, 1.0], "paper", tmp_path, jobs=1,
                    progress=False)
    page = (tmp_path / "report.html").read_text()
    for name, _ in PLOTS:
        assert (tmp_path / name).is_file() and f'<img src="{name}"' in page
    md = markdown(res)
    assert page.count("<table>") == md.count("\n|---") and page.count("<table>") >= 9
    for cell in re.findall(r"\| ([\d.]+) \|", md):
        assert f'<td class="n">{cell}</td>' in page
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")


def test_no_plots_no_images(tmp_path: Path) -> None:
    page = render(_result(), [])
    assert "<img" not in page and "--no-plots" in page
    assert "an &lt;assumption&gt;" in page  # escaped


@pytest.fixture(autouse=True)
def _agg() -> None:
    import matplotlib

    matplotlib.use("Agg")
