"""``report.html``: a sweep on one page a browser opens: what was run, the preset's
assumptions, the plots and every table.

The tables are the sweep's own Markdown (``sweep.markdown``) turned into HTML, so the
page and ``sweep.md`` cannot disagree; the plots are the PNGs ``replay.plots`` wrote
next to it (referenced by relative path, so the folder can be moved or served as is).
No dependency beyond the standard library.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from pathlib import Path

from flatcake.replay.results import SweepResult, markdown

CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1300px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
.plots figure { margin: 0; flex: 0 1 49%; min-width: 420px; }
.plots .wide { flex-basis: 100%; }
.plots img { width: 100%; border: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.4em 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f2f2f2; } tr:nth-child(even) td { background: #fafafa; }
details { margin: 0.6em 0; } code { background: #f4f4f4; padding: 0 3px; }
.meta { color: #555; }
"""

_NUMBER = re.compile(r"^[-+]?[\d.,]+%?$|^–$")


def _inline(text: str) -> str:
    """Escape ``text`` and render its `code` spans."""
    parts = text.split("`")
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p)
                   for i, p in enumerate(parts))


def markdown_to_html(text: str) -> str:
    """The subset of Markdown the sweep writes: ``#``/``##`` headings, pipe tables
    (first row the header, second the alignment row) and paragraphs."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("## "):
            out.append(f"<h2>{_inline(line[3:])}</h2>")
        elif line.startswith("# "):
            out.append(f"<h1>{_inline(line[2:])}</h1>")
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            body = [r for r in rows[1:] if not all(set(c) <= set("-:") for c in r)]
            out.append("<table><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in rows[0])
                       + "</tr>")
            for r in body:
                out.append("<tr>" + "".join(
                    f'<td class="n">{_inline(c)}</td>' if _NUMBER.match(c)
                    else f"<td>{_inline(c)}</td>" for c in r) + "</tr>")
            out.append("</table>")
            continue
        elif line:
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    return "\n".join(out)


def render(result: SweepResult, plot_names: list[str]) -> str:
    """The page's HTML for ``result``, showing the plots named ``plot_names``."""
    from flatcake.replay.plots import title

    meta = result.meta
    md = markdown(result)
    head, _, tables = md.partition("\n## ")
    # Single-panel figures two to a row, the two-panel TTFT figure across the page.
    figures = "\n".join(
        f'<figure class="{"wide" if name == "ttft.png" else ""}">'
        f'<img src="{html.escape(name)}" alt="{html.escape(name)}"></figure>'
        for name in sorted(plot_names, key=lambda n: n == "ttft.png"))
    assumptions = "".join(f"<li>{_inline(a)}</li>" for a in meta.get("assumptions", []))
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title(result))}</title>", f"<style>{CSS}</style>",
        "</head><body>",
        markdown_to_html(head),
        f'<p class="meta">{html.escape(title(result))}; systems '
        f"{_inline(', '.join(meta['systems']))}; rates "
        f"{html.escape(', '.join(f'{r:g}' for r in meta['rates']))} req/s. "
        "Tables and plots from the same runs (<code>sweep.json</code>).</p>",
        f"<details><summary>Preset <code>{html.escape(str(meta['preset']))}</code>: "
        f"{len(meta.get('assumptions', []))} assumptions</summary><ul>{assumptions}</ul>"
        "</details>",
        f'<div class="plots">{figures}</div>' if figures else
        "<p>No plots (<code>--no-plots</code>).</p>",
        markdown_to_html("## " + tables) if tables else "",
        "</body></html>", ""])


def write_html(result: SweepResult, out: str | Path,
               plots: Sequence[str | Path] = ()) -> Path:
    """Write ``out/report.html`` showing ``plots`` (images in ``out``)."""
    path = Path(out) / "report.html"
    path.write_text(render(result, [Path(p).name for p in plots]), encoding="utf-8")
    return path
