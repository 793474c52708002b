"""``read_trace``: one entry point that picks the reader for a file's format."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from flatcake.traces.model import Trace
from flatcake.traces.readers.azure import read_azure
from flatcake.traces.readers.claude_code import read_claude_code
from flatcake.traces.readers.mooncake import read_mooncake
from flatcake.traces.readers.native import read_native
from flatcake.traces.source import FORMATS, detect_format

logger = logging.getLogger(__name__)

READERS: dict[str, Callable[..., Trace]] = {
    "native": read_native,
    "mooncake": read_mooncake,
    "claude-code": read_claude_code,
    "azure": read_azure,
}


def read_trace(path: str | Path, *, format: str | None = None, skip_bad: bool = False) -> Trace:
    """Read ``path`` (plain or gzip) in ``format``, detected from its first line if None.

    Raises ``FileNotFoundError`` for a missing file and ``TraceFormatError`` (a
    ``ValueError`` naming file, line and field) for malformed input unless ``skip_bad``,
    which drops bad lines and counts them in ``Trace.num_skipped_lines``.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"trace file not found: {p}")
    fmt = format or detect_format(p)
    if fmt not in READERS:
        raise ValueError(f"unknown trace format {fmt!r}; choose one of {FORMATS}")
    start = time.perf_counter()
    trace = READERS[fmt](p, skip_bad=skip_bad)
    logger.info("read %s in %.1f s", trace.summary(), time.perf_counter() - start)
    if trace.num_skipped_lines:
        logger.warning("%s: skipped %d malformed lines", p, trace.num_skipped_lines)
    return trace
