"""Opening trace files: transparent gzip, format detection, error reporting.

Every reader reports malformed input as :class:`TraceFormatError` (a ``ValueError``)
naming the file, the 1-based line and the field. With ``skip_bad`` a reader drops the
bad line instead, counts it in ``Trace.num_skipped_lines`` and keeps the first few
messages in ``Trace.skipped_examples``; nothing is dropped silently.
"""

from __future__ import annotations

import gzip
import logging
import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, cast

from flatcake import progress

logger = logging.getLogger(__name__)

GZIP_MAGIC = b"\x1f\x8b"
MAX_SKIPPED_EXAMPLES = 5

FORMATS: tuple[str, ...] = ("native", "mooncake", "claude-code", "azure")
"""Format names accepted by ``read_trace(format=...)`` and ``--format``."""


class TraceFormatError(ValueError):
    """Malformed trace input, located by file, line (1-based, 0 = whole file) and field."""

    def __init__(self, path: str | Path, line: int, field: str, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.field = field
        self.message = message
        where = f"{self.path}:{line}" if line else self.path
        super().__init__(f"{where}: field {field!r}: {message}")


class SkipLog:
    """Counts lines dropped under ``skip_bad`` and keeps the first few messages."""

    def __init__(self, skip_bad: bool) -> None:
        self.skip_bad = skip_bad
        self.count = 0
        self.examples: list[str] = []

    def handle(self, err: TraceFormatError) -> None:
        """Record ``err`` when skipping, else raise it."""
        if not self.skip_bad:
            raise err
        self.count += 1
        if len(self.examples) < MAX_SKIPPED_EXAMPLES:
            self.examples.append(str(err))
        logger.debug("skipped bad line: %s", err)


@contextmanager
def open_binary(path: str | Path, *, show_progress: bool = True) -> Iterator[IO[bytes]]:
    """Open ``path`` for binary reading, decompressing gzip by its magic bytes. A
    progress bar counts the file's bytes when the caller turned bars on
    (``flatcake.progress``) and ``show_progress``."""
    p = Path(path)
    with open(p, "rb") as f:
        magic = f.read(2)
        f.seek(0)
        src = progress.reading(f, os.fstat(f.fileno()).st_size, f"reading {p.name}") \
            if show_progress else f
        try:
            if magic == GZIP_MAGIC:
                with gzip.open(src, "rb") as gz:
                    try:
                        yield cast(IO[bytes], gz)
                    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
                        raise TraceFormatError(p, 0, "<gzip>", f"compressed data is "
                                               f"truncated or corrupt ({exc})") from None
            else:
                yield src
        finally:
            if src is not f:
                src.close()


def detect_format(path: str | Path) -> str:
    """Guess the format of ``path`` from its first line; raises ``TraceFormatError``."""
    with open_binary(path, show_progress=False) as f:
        head = f.readline(1 << 16).lstrip()
    if not head:
        raise TraceFormatError(path, 1, "<format>", "file is empty")
    if head.startswith(b"{"):
        if b'"flatcake_trace"' in head:
            return "native"
        if b'"hash_id_scope"' in head or b'"requests"' in head:
            return "claude-code"
        if b'"input_length"' in head or b'"hash_ids"' in head:
            return "mooncake"
    elif b"contexttokens" in head.lower():
        return "azure"
    raise TraceFormatError(path, 1, "<format>",
                           f"cannot detect the trace format; pass one of {FORMATS} explicitly")
