"""Progress bars for long work, drawn only where a person is watching (and ``size_text``,
the byte sizes that bars, reports and `flatcake inspect` print).

Library code marks its long loops with :func:`task` (a bar with a total), :func:`track`
(an iterable) or :func:`reading` (a file read front to back, counted in bytes); all
three are free no-ops unless the caller turned bars on for the extent of a call with
``with shown(True):``. The command line does that once, in ``flatcake.cli.main``, when
stdout and stderr are terminals and the command was not asked for ``--json``: bars go to
stderr, with rate and ETA (tqdm), and vanish when done, so they never mix with
machine-readable output, logs in files or tests.

Why a context variable and not a parameter: like logging, whether to draw is the
caller's business, the default is silence, and threading a ``progress=`` argument
through every trace reader, the simulator and the bench would change a dozen
signatures for a display concern. Worker processes (the sweep's pool) start silent.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import IO, Any, Protocol, TypeVar

T = TypeVar("T")

_SHOWN: ContextVar[bool] = ContextVar("flatcake_progress_shown", default=False)


class Bar(Protocol):
    """What a long loop sees: ``update(n)`` as work is done, ``close()`` at the end."""

    def update(self, n: float = 1) -> Any: ...

    def close(self) -> None: ...


class _Silent:
    def update(self, n: float = 1) -> None:
        pass

    def close(self) -> None:
        pass


@contextmanager
def shown(enabled: bool) -> Iterator[None]:
    """Draw bars (``enabled``) or not for everything run inside this block."""
    token = _SHOWN.set(enabled)
    try:
        yield
    finally:
        _SHOWN.reset(token)


def is_shown() -> bool:
    return _SHOWN.get()


def on_terminal(json_out: bool = False) -> bool:
    """Whether a command should draw bars: a person at a terminal, no ``--json``."""
    return not json_out and sys.stdout.isatty() and sys.stderr.isatty()


def task(desc: str, total: float | None = None, unit: str = "it", *,
         unit_scale: bool = False) -> Bar:
    """A bar for ``total`` units of work (rate and ETA when ``total`` is known)."""
    if not _SHOWN.get():
        return _Silent()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, leave=False,
                file=sys.stderr, dynamic_ncols=True, mininterval=0.25)


def track(items: Iterable[T], desc: str, total: int | None = None,
          unit: str = "it") -> Iterator[T]:
    """Yield ``items`` while a bar counts them."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    bar = task(desc, total, unit)
    try:
        for item in items:
            yield item
            bar.update(1)
    finally:
        bar.close()


class _CountedRaw(io.RawIOBase):
    """A raw reader over ``inner`` that reports every byte it hands out to ``bar``."""

    def __init__(self, inner: IO[bytes], bar: Bar) -> None:
        self._inner = inner
        self._bar = bar

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._inner.readinto(buffer)  # type: ignore[attr-defined]
        if n:
            self._bar.update(n)
        return n or 0

    def close(self) -> None:
        if not self.closed:
            self._bar.close()
        super().close()


def reading(f: IO[bytes], total_bytes: int, desc: str) -> IO[bytes]:
    """``f`` itself when bars are off; else a buffered reader over it whose reads move a
    byte-counting bar (closing it closes the bar, not ``f``)."""
    if not _SHOWN.get():
        return f
    bar = task(desc, total_bytes, "B", unit_scale=True)
    return io.BufferedReader(_CountedRaw(f, bar), buffer_size=1 << 20)


def size_text(num_bytes: int) -> str:
    """``num_bytes`` in the largest binary unit it reaches (``1.00 GiB``)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{num_bytes} B"
