"""What a run leaves in ``--out``: the per-request JSONL, the summary JSON, one plot.

    requests.jsonl   one line per request, written as it completes (``Record.to_json``)
    warmup.jsonl     the same for the warm-up requests (``--warmup``), not summarized
    summary.json     {"summary": Summary, "run": how it was run (URL, model, workload,
                     pacing, how it ended)}
    ttft.png         TTFT of each request over the run (colour: cached share of its
                     prompt) and the TTFT CDF; only with matplotlib, never with --no-plots
    report.html      the run on one page a browser opens: how it was run, the summary
                     table and the plot (the sweep page's HTML, ``replay.page``)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flatcake.loadgen.driver import Record
from flatcake.loadgen.summary import Summary

REQUESTS_FILE = "requests.jsonl"
WARMUP_FILE = "warmup.jsonl"
SUMMARY_FILE = "summary.json"
PLOT_FILE = "ttft.png"
PAGE_FILE = "report.html"


@contextmanager
def record_log(out: Path, name: str = REQUESTS_FILE) -> Iterator[Callable[[Record], None]]:
    """A writer of ``name`` (``requests.jsonl``) under ``out``: one line per record,
    flushed as each comes (a run cut short keeps what it did)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / name, "w") as fh:
        def write(record: Record) -> None:
            fh.write(json.dumps(record.to_json(), separators=(",", ":")) + "\n")
            fh.flush()

        yield write


def write_summary(out: Path, summary: Summary, run: dict[str, Any]) -> Path:
    path = out / SUMMARY_FILE
    path.write_text(json.dumps({"summary": summary.to_json(), "run": run}, indent=2) + "\n")
    return path


def plot(out: Path, records: list[Record], title: str) -> Path | None:
    """``ttft.png``; None when matplotlib is missing or no request succeeded."""
    ok = [r for r in records if r.reply.ok and r.reply.ttft_s is not None]
    if not ok:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    share = [(r.reply.cached_tokens or 0) / max(1, r.prompt_tokens_sent) for r in ok]
    dots = left.scatter([r.sent_s for r in ok], [r.reply.ttft_s for r in ok], c=share,
                        cmap="viridis", vmin=0, vmax=1, s=12)
    fig.colorbar(dots, ax=left, label="cached share of the prompt")
    left.set(xlabel="sent at (s)", ylabel="TTFT (s)", title="TTFT over the run")
    ttft = sorted(r.reply.ttft_s for r in ok if r.reply.ttft_s is not None)
    right.plot(ttft, [(i + 1) / len(ttft) for i in range(len(ttft))])
    right.set(xlabel="TTFT (s)", ylabel="share of requests", title="TTFT CDF")
    right.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = out / PLOT_FILE
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_page(out: Path, summary: Summary, run: dict[str, Any],
               picture: Path | None) -> Path:
    """``report.html``: the run's settings, the summary as a table and ``picture``."""
    import html

    from flatcake.loadgen.summary import markdown
    from flatcake.replay.page import CSS, markdown_to_html

    title = f"flatcake loadgen: {run['workload']}"
    how = [("server", f"{run['url']} (model {run['model']}, max_model_len "
                      f"{run['max_model_len']})"),
           ("pacing", f"{run['pacing']}, until {run['bounds']}"),
           ("warm-up", f"{run.get('warmup_requests') or 0} requests, not measured"),
           ("session ids sent", "yes" if run.get("session_ids") else "no"),
           ("output tokens", str(run["max_tokens"])), ("seed", str(run["seed"]))]
    how_md = "\n".join(["| run | |", "|---|---|", *(f"| {k} | {v} |" for k, v in how)])
    figure = (f'<div class="plots"><figure class="wide"><img src="{html.escape(picture.name)}" '
              f'alt="TTFT"></figure></div>' if picture else "<p>No plot.</p>")
    page = "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>", f"<style>{CSS}</style>", "</head><body>",
        f"<h1>{html.escape(title)}</h1>",
        markdown_to_html("## Summary\n" + markdown(summary)), figure,
        markdown_to_html("## How it was run\n" + how_md),
        f'<p class="meta">Per request: <code>{REQUESTS_FILE}</code>; the same numbers: '
        f"<code>{SUMMARY_FILE}</code>.</p>", "</body></html>", ""])
    path = out / PAGE_FILE
    path.write_text(page, encoding="utf-8")
    return path
