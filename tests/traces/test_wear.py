"""The SSD wear ``flatcake analyze`` expects of a trace before any replay, by hand."""

from __future__ import annotations

import pytest

from flatcake.geometry import preset
from flatcake.traces import analyze_trace
from flatcake.traces.wear import expected_wear
from tests.traces.helpers import global_trace

GEOM = preset("llama-3.1-8b")  # every layer keeps every block
BLOCK = 4 * GEOM.history_block_bytes // GEOM.tokens_per_block


def test_each_distinct_block_written_once_and_the_unreused_never_read() -> None:
    st = analyze_trace(global_trace(), GEOM).stats
    w = expected_wear(st, GEOM, drive_bytes=10**9)
    assert w is not None
    assert w.written_bytes == 6 * BLOCK
    assert w.never_read_bytes == 3 * BLOCK
    assert w.read_bytes == pytest.approx(5 * BLOCK)
    assert w.span_s == 10.0
    assert w.drive_writes_per_day == pytest.approx(6 * BLOCK / 1e9 * 86400 / 10)
    # At a stated rate the span is the requests over it: 4 requests at 2 req/s.
    at_rate = expected_wear(st, GEOM, drive_bytes=10**9, rate_req_s=2.0)
    assert at_rate is not None and at_rate.span_s == 2.0
    assert "drive-writes/day on a 0.001 TB drive" in w.line()
