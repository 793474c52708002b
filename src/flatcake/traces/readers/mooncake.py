"""Reader for the Mooncake trace format (FAST'25 ``conversation_trace.jsonl``).

One JSON object per line, one request per line, in arrival order::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52,
     "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59]}

``timestamp`` is milliseconds on one global clock; ``hash_ids`` are global chained
prefix-block ids of ``block_size_tokens`` (512) tokens with the last, partial block
included, so ``len(hash_ids) == ceil(input_length / 512)``. The format has no sessions.
Requests are kept in arrival order (a stable sort by timestamp if the file is not).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flatcake.traces.hashlists import (
    HashListDecoder,
    JSONDecodeError,
    check_global_ids,
    lift_hash_lists,
    loads,
)
from flatcake.traces.model import Trace, build_trace
from flatcake.traces.readers.fields import Fields
from flatcake.traces.source import SkipLog, TraceFormatError, open_binary

FORMAT = "mooncake"
MOONCAKE_BLOCK_SIZE_TOKENS = 512


def read_mooncake(path: str | Path, *, skip_bad: bool = False,
                  block_size_tokens: int = MOONCAKE_BLOCK_SIZE_TOKENS) -> Trace:
    """Read a Mooncake JSONL trace (plain or gzip); see the module docstring."""
    if block_size_tokens <= 0:
        raise ValueError(f"block_size_tokens must be > 0, got {block_size_tokens}")
    skips = SkipLog(skip_bad)
    decoder = HashListDecoder()
    times: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    counts: list[int] = []
    hashes: list[np.ndarray] = []
    with open_binary(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                t, n_in, n_out, h = _parse_line(path, lineno, line, decoder, block_size_tokens)
            except TraceFormatError as err:
                decoder.reset()
                skips.handle(err)
                continue
            times.append(t)
            ins.append(n_in)
            outs.append(n_out)
            counts.append(len(h))
            hashes.append(h)
    time_s = np.asarray(times, dtype=np.float64)
    if len(time_s) and np.any(np.diff(time_s) < 0):
        order = np.argsort(time_s, kind="stable")
        time_s = time_s[order]
        ins = [ins[k] for k in order]
        outs = [outs[k] for k in order]
        counts = [counts[k] for k in order]
        hashes = [hashes[k] for k in order]
    if len(time_s):
        time_s -= time_s[0]
    return build_trace(
        name=Path(path).name, source_format=FORMAT, block_size_tokens=block_size_tokens,
        clock="global", has_hashes=True, partial_last_block=True, time_s=time_s,
        input_tokens=ins, output_tokens=outs, block_counts=counts,
        block_hashes=np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.int64),
        num_skipped_lines=skips.count, skipped_examples=skips.examples)


def _parse_line(path: str | Path, lineno: int, line: bytes, decoder: HashListDecoder,
                block_size: int) -> tuple[float, int, int, np.ndarray]:
    slim, spans = lift_hash_lists(line)
    fast = len(spans) == 1
    try:
        obj = loads(slim if fast else line)
    except JSONDecodeError as exc:
        if not fast:
            raise TraceFormatError(path, lineno, "<json>", f"invalid JSON ({exc})") from None
        fast = False
        try:
            obj = loads(line)
        except JSONDecodeError as exc2:
            raise TraceFormatError(path, lineno, "<json>", f"invalid JSON ({exc2})") from None
    f = Fields(obj, path, lineno)
    t_ms = f.get_number("timestamp")
    n_in = f.get_int("input_length")
    n_out = f.get_int("output_length")
    raw = f.raw("hash_ids")
    try:
        if fast and type(raw) is int and raw == 0:
            h = decoder.decode(spans[0])
        else:
            h = decoder.decode_list(raw)
        check_global_ids(h)
    except ValueError as exc:
        raise f.error("hash_ids", str(exc)) from None
    expected = -(-n_in // block_size)
    if len(h) != expected:
        raise f.error("hash_ids", f"has {len(h)} ids, expected ceil(input_length / "
                      f"{block_size}) = {expected} for input_length={n_in}")
    return t_ms / 1000.0, n_in, n_out, h
