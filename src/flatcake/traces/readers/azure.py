"""Reader for the Azure LLM inference CSVs (2023 Splitwise sample): lengths only.

::

    TIMESTAMP,ContextTokens,GeneratedTokens
    2023-11-16 18:17:03.9799600,4808,10

The files carry no block hashes and no sessions: the trace drives arrival times and
request lengths only, and prefix statistics cannot be computed from it
(``Trace.has_hashes`` is False). Timestamps are read as UTC; ``time_s`` counts from
the first request and ``start_unix_s`` keeps its wall time.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from flatcake.traces.model import Trace, build_trace
from flatcake.traces.source import SkipLog, TraceFormatError, open_binary

FORMAT = "azure"
COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
DEFAULT_BLOCK_SIZE_TOKENS = 16
"""Nominal block size for the model (vLLM's default); the trace itself has no blocks."""


def _parse_time(text: str) -> float:
    """Seconds since the epoch of ``YYYY-MM-DD HH:MM:SS[.fraction]`` read as UTC.

    The fraction is parsed separately: this dataset writes seven digits.
    """
    head, dot, frac = text.strip().partition(".")
    if dot and not frac.isdigit():
        raise ValueError(f"bad fractional seconds in {text!r}")
    stamp = datetime.fromisoformat(head).replace(tzinfo=UTC).timestamp()
    return stamp + (float("0." + frac) if dot else 0.0)


def read_azure(path: str | Path, *, skip_bad: bool = False,
               block_size_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS) -> Trace:
    """Read an Azure LLM inference CSV (plain or gzip); see the module docstring."""
    skips = SkipLog(skip_bad)
    times: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    with open_binary(path) as fb:
        text = io.TextIOWrapper(fb, encoding="utf-8", newline="")
        rows = csv.reader(text)
        header = next(rows, None)
        if header is None or [h.strip() for h in header] != list(COLUMNS):
            raise TraceFormatError(path, 1, "<header>",
                                   f"expected columns {','.join(COLUMNS)}, got {header!r}")
        for row in rows:
            lineno = rows.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            try:
                t, n_in, n_out = _parse_row(path, lineno, row)
            except TraceFormatError as err:
                skips.handle(err)
                continue
            times.append(t)
            ins.append(n_in)
            outs.append(n_out)
    time_abs = np.asarray(times, dtype=np.float64)
    order = np.argsort(time_abs, kind="stable")
    start = float(time_abs[order[0]]) if len(order) else None
    n = len(order)
    return build_trace(
        name=Path(path).name, source_format=FORMAT, block_size_tokens=block_size_tokens,
        clock="global", has_hashes=False, partial_last_block=False,
        time_s=time_abs[order] - (start or 0.0),
        input_tokens=np.asarray(ins, dtype=np.int64)[order],
        output_tokens=np.asarray(outs, dtype=np.int64)[order],
        block_counts=np.zeros(n, dtype=np.int64), block_hashes=np.zeros(0, dtype=np.int64),
        start_unix_s=start, num_skipped_lines=skips.count, skipped_examples=skips.examples)


def _parse_row(path: str | Path, lineno: int, row: list[str]) -> tuple[float, int, int]:
    if len(row) != len(COLUMNS):
        raise TraceFormatError(path, lineno, "<row>",
                               f"expected {len(COLUMNS)} columns, got {len(row)}")
    try:
        t = _parse_time(row[0])
    except ValueError:
        raise TraceFormatError(path, lineno, COLUMNS[0],
                               f"bad timestamp {row[0]!r}") from None
    values = []
    for name, cell in zip(COLUMNS[1:], row[1:], strict=True):
        try:
            v = int(cell)
        except ValueError:
            raise TraceFormatError(path, lineno, name, f"must be an integer, got {cell!r}") \
                from None
        if v < 0:
            raise TraceFormatError(path, lineno, name, f"must be >= 0, got {v}")
        values.append(v)
    return t, values[0], values[1]
