"""The summary math: percentiles as numpy computes them, the cached share over what the
server reported, the reusable share the client knows, failures counted apart."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flatcake.loadgen import Record, Reply, percentile, summarize, table


def rec(i: int, ttft: float | None, prompt: int = 100, cached: int | None = 0,
        reusable: int = 0, error: str | None = None) -> Record:
    reply = Reply(status=200 if error is None else 400, ttft_s=ttft,
                  e2e_s=None if ttft is None else ttft + 0.5, prompt_tokens=prompt,
                  cached_tokens=cached, completion_tokens=4, error=error)
    return Record(index=i, session_id=f"s{i}", turn=0, due_s=i, sent_s=i,
                  prompt_tokens_sent=prompt, reusable_tokens=reusable, reply=reply)


@given(st.lists(st.floats(0, 1e3), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_is_numpys_linear_interpolation(xs: list[float], q: float) -> None:
    assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), abs=1e-9)


def test_percentile_of_nothing_or_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="q must be in"):
        percentile([1.0], 101)


def test_a_run_in_numbers() -> None:
    records = [rec(0, 1.0, cached=0, reusable=0), rec(1, 0.2, cached=90, reusable=96),
               rec(2, 0.4, cached=60, reusable=96), rec(3, None, error="HTTP 500: boom"),
               rec(4, None, error="HTTP 500: boom")]
    s = summarize(records, wall_s=2.0)
    assert (s.requests, s.ok, s.errors) == (5, 3, 2)
    assert s.req_per_s == 1.5 and s.output_tokens_per_s == 6.0
    assert s.ttft_p50_s == 0.4 and s.ttft_mean_s == pytest.approx(1.6 / 3)
    assert s.ttft_p99_s == pytest.approx(0.4 + 0.98 * 0.6)
    assert s.e2e_p50_s == 0.9
    assert s.prompt_tokens == 300 and s.cached_tokens == 150
    assert s.cached_share == 0.5 and s.reusable_share == pytest.approx(192 / 300)
    assert s.cached_of_reusable == pytest.approx(150 / 192)
    assert s.error_examples == ("HTTP 500: boom",)
    text = table(s)
    assert "50.0 %" in text and "3 ok, 2 failed" in text and "error: HTTP 500" in text


def test_a_server_that_reports_no_cached_tokens_says_so() -> None:
    s = summarize([rec(0, 0.1, cached=None), rec(1, 0.2, cached=None)], wall_s=1.0)
    assert s.cached_tokens is None and s.cached_share is None
    assert "--enable-prompt-tokens-details" in table(s)


def test_nothing_succeeded() -> None:
    s = summarize([rec(0, None, error="connection refused")], wall_s=0.0)
    assert s.ok == 0 and s.ttft_p50_s is None and s.req_per_s == 0.0
    assert s.cached_share is None and s.reusable_share is None
    assert re.search(r"TTFT p50 / p95 / p99 +- / - / -", table(s))
