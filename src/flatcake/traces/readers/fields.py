"""Typed field access for JSON trace records, raising located ``TraceFormatError``s."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from flatcake.traces.source import TraceFormatError


class Fields:
    """Reads checked fields of one JSON object found at ``path``:``line``.

    ``prefix`` is prepended to field names in errors (``"requests[3]."``).
    """

    __slots__ = ("line", "obj", "path", "prefix")

    def __init__(self, obj: Any, path: str | Path, line: int, prefix: str = "") -> None:
        if not isinstance(obj, dict):
            raise TraceFormatError(path, line, prefix.rstrip(".") or "<record>",
                                   f"must be a JSON object, got {type(obj).__name__}")
        self.obj: dict[str, Any] = obj
        self.path = path
        self.line = line
        self.prefix = prefix

    def error(self, key: str, message: str) -> TraceFormatError:
        return TraceFormatError(self.path, self.line, self.prefix + key, message)

    def has(self, key: str) -> bool:
        return self.obj.get(key) is not None

    def raw(self, key: str) -> Any:
        if key not in self.obj:
            raise self.error(key, "is missing")
        return self.obj[key]

    def get_int(self, key: str, *, default: int | None = None, minimum: int = 0) -> int:
        if default is not None and self.obj.get(key) is None:
            return default
        v = self.raw(key)
        if type(v) is not int:
            # Integral floats (e.g. 120.0) are accepted: some writers emit all numbers as floats.
            if type(v) is float and v.is_integer():
                v = int(v)
            else:
                raise self.error(key, f"must be an integer, got {v!r}")
        if v < minimum:
            raise self.error(key, f"must be >= {minimum}, got {v}")
        return v

    def get_number(self, key: str, *, default: float | None = None, minimum: float = 0.0) -> float:
        if default is not None and self.obj.get(key) is None:
            return default
        v = self.raw(key)
        if type(v) not in (int, float):
            raise self.error(key, f"must be a number, got {v!r}")
        f = float(v)
        if not math.isfinite(f) or f < minimum:
            raise self.error(key, f"must be a finite number >= {minimum}, got {v!r}")
        return f

    def get_str(self, key: str, *, default: str | None = None) -> str:
        if default is not None and self.obj.get(key) is None:
            return default
        v = self.raw(key)
        if not isinstance(v, str):
            raise self.error(key, f"must be a string, got {v!r}")
        return v

    def get_list(self, key: str) -> list[Any]:
        v = self.raw(key)
        if not isinstance(v, list):
            raise self.error(key, f"must be a list, got {type(v).__name__}")
        return v
