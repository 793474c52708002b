"""The report's tables: the sensitivity table names the budget it varies."""

from __future__ import annotations

from flatcake.replay.results import SweepResult
from flatcake.report.steps import layer_kinds, sensitivity_table


def test_sensitivity_table_names_the_budget() -> None:
    run = {"system": "flatcake", "rate_req_s": 1.0, "hit_rate_gpu": 0.9, "ttft_mean_s": 0.3,
           "ttft_p99_s": 2.0}
    res = SweepResult([run], {"systems": ["flatcake"], "rates": [1.0]})
    lines = sensitivity_table({3: res}, "GPU KV pool per worker", "GPU KV pool")
    assert lines[0].startswith("## GPU KV pool (every system, 1 req/s")
    assert "| 3 GiB | 90.00% / 0.300 / 2.000 s |" in lines


def test_layer_kinds_table_lists_commands_and_bytes_per_kind() -> None:
    extra = {"restore_commands_by_kind": {"sliding": 2.0, "c4a": 21.5},
             "ssd_written_bytes_by_kind": {"sliding": 3e9, "c4a": 4e10},
             "ssd_saved_by_windows_bytes": 5e9, "ssd_window_bytes_released": 1e9,
             "ssd_not_stored_bytes": 7e9}
    runs = [{"system": "flatcake", "rate_req_s": 1.0, "extra": extra},
            {"system": "tiered", "rate_req_s": 1.0, "extra": {}}]
    lines = layer_kinds(SweepResult(runs, {"systems": ["flatcake", "tiered"],
                                           "rates": [1.0]}))
    assert lines[0] == "## Layer kinds"
    assert ("| flatcake | 1 | sliding 2.0, c4a 21.5 | sliding 3.0, c4a 40.0 | 5.0 | 1.0 "
            "| 7.0 |") in lines
    assert not any(line.startswith("| tiered |") for line in lines)
    assert layer_kinds(SweepResult(runs[1:], {"systems": ["tiered"], "rates": [1.0]})) == []
