"""The report's tables: the sensitivity table names the budget it varies."""

from __future__ import annotations

from flatcake.replay.results import SweepResult
from flatcake.report.steps import sensitivity_table


def test_sensitivity_table_names_the_budget() -> None:
    run = {"system": "flatcake", "rate_req_s": 1.0, "hit_rate_gpu": 0.9, "ttft_mean_s": 0.3,
           "ttft_p99_s": 2.0}
    res = SweepResult([run], {"systems": ["flatcake"], "rates": [1.0]})
    lines = sensitivity_table({3: res}, "GPU KV pool per worker", "GPU KV pool")
    assert lines[0].startswith("## GPU KV pool (every system, 1 req/s")
    assert "| 3 GiB | 90.00% / 0.300 / 2.000 s |" in lines
