"""Fast decoding of JSON ``hash_ids`` lists into int64 arrays.

Building 71 M Python ints and converting them costs more than parsing the rest of the
Claude Code file, so readers lift every ``"hash_ids": [...]`` list out of a line as raw
bytes before the JSON parse (the parsed object holds the list's index instead) and
decode the bytes with numpy. Consecutive requests of a session usually extend the
previous request's list (chained prefix ids: a new turn appends blocks), so when a
list's text starts with the previous list's text followed by a comma, only the tail is
parsed.

Invariant: every span is either decoded exactly or rejected with ``ValueError``; numpy
only decodes spans without signs whose element count matches their commas, anything
else (floats, strings, negative or huge ints) goes through the exact JSON path.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import numpy as np
import orjson

from flatcake.traces.model import MAX_LOCAL_BLOCK_ID, SESSION_SHIFT

loads = orjson.loads
JSONDecodeError = orjson.JSONDecodeError

_HASH_LIST = re.compile(rb'"hash_ids"\s*:\s*\[([^\]]*)\]')
_EMPTY = np.zeros(0, dtype=np.int64)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def lift_hash_lists(line: bytes) -> tuple[bytes, list[bytes]]:
    """Replace each ``"hash_ids": [...]`` in ``line`` by ``"hash_ids": k``.

    Returns the slimmed line and the list bodies (text between the brackets) in order.
    A nested list breaks the slimmed JSON, and a match inside a JSON string leaves the
    placeholder count the caller consumes different from ``len(spans)``; in both cases
    the caller reparses the original line the slow way.
    """
    spans: list[bytes] = []
    parts: list[bytes] = []
    last = 0
    for m in _HASH_LIST.finditer(line):
        parts.append(line[last:m.start()])
        parts.append(b'"hash_ids":%d' % len(spans))
        spans.append(m.group(1))
        last = m.end()
    if not spans:
        return line, spans
    parts.append(line[last:])
    return b"".join(parts), spans


def parse_int_list(text: bytes) -> np.ndarray:
    """Decode the body of a JSON int list; raises ``ValueError`` naming what is wrong.

    numpy's text parser is strict except for a lone sign, a trailing comma and
    saturation of huge values: signs go to the exact path, the element count is checked
    against the commas, and saturated values are left for the caller's range check.
    """
    if not text or text.isspace():
        return _EMPTY
    if b"-" in text or b"+" in text:
        return _parse_exact(text)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        try:
            arr = np.fromstring(text, dtype=np.int64, sep=",")
        except ValueError:
            return _parse_exact(text)
    if len(arr) != text.count(b",") + 1:
        return _parse_exact(text)
    return arr


def _parse_exact(text: bytes) -> np.ndarray:
    try:
        values = loads(b"[" + text + b"]")
    except JSONDecodeError as exc:
        raise ValueError(f"is not a JSON list of ints ({exc})") from None
    return ints_to_array(values)


def ints_to_array(values: Any) -> np.ndarray:
    """Check that ``values`` is a list of int64-range ints and convert it."""
    if not isinstance(values, list):
        raise ValueError(f"must be a list of ints, got {type(values).__name__}")
    for v in values:
        if type(v) is not int:
            raise ValueError(f"must hold ints only, got {v!r}")
        if not _INT64_MIN <= v < _INT64_MAX:
            raise ValueError(f"id {v} is outside the int64 range [-2**63, 2**63 - 1)")
    return np.array(values, dtype=np.int64) if values else _EMPTY


def check_global_ids(arr: np.ndarray) -> None:
    """Reject ids that numpy saturated (text beyond int64); 2**63 - 1 itself is reserved."""
    if len(arr) and (int(arr.max()) == _INT64_MAX or int(arr.min()) == _INT64_MIN):
        raise ValueError("holds an id outside the int64 range [-2**63, 2**63 - 1)")


def namespace_ids(arr: np.ndarray, namespace: int) -> np.ndarray:
    """Return ``namespace << SESSION_SHIFT | arr`` after checking ``0 <= arr < 2**40``."""
    if not len(arr):
        return arr
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi > MAX_LOCAL_BLOCK_ID:
        bad = lo if lo < 0 else hi
        raise ValueError(f"per-session id {bad} is outside [0, {MAX_LOCAL_BLOCK_ID}]")
    if not namespace:
        return arr
    return arr | (np.int64(namespace) << np.int64(SESSION_SHIFT))


class HashListDecoder:
    """Decodes the hash lists of one stream of requests, reusing the previous list.

    Returned arrays may be shared between consecutive requests with identical lists:
    treat them as read-only. Call :meth:`reset` where the chain of lists breaks (a new
    session), so that ids of different namespaces are never spliced.
    """

    def __init__(self) -> None:
        self._prev_span: bytes | None = None
        self._prev: np.ndarray = _EMPTY

    def reset(self) -> None:
        self._prev_span = None
        self._prev = _EMPTY

    def decode(self, span: bytes) -> np.ndarray:
        """Decode one list body; raises ``ValueError`` with the reason."""
        prev = self._prev_span
        if prev is not None and span.startswith(prev):
            tail = span[len(prev):].lstrip()
            if not tail:
                return self._prev
            if tail[:1] == b"," and prev and not prev.isspace():
                arr = np.concatenate([self._prev, parse_int_list(tail[1:])])
                self._prev_span, self._prev = span, arr
                return arr
        arr = parse_int_list(span)
        self._prev_span, self._prev = span, arr
        return arr

    def decode_list(self, values: Any) -> np.ndarray:
        """Decode an already parsed JSON value (the slow path)."""
        self.reset()
        return ints_to_array(values)
