"""The report's tables: the sensitivity table names the budget it varies."""

from __future__ import annotations

import math

from flatcake.replay.results import SweepResult
from flatcake.report.steps import layer_kinds, sensitivity_table
from flatcake.report.windows import windows_table


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


def test_windows_table_pairs_rebuilt_and_prefix_cached_runs() -> None:
    def run(system: str, hit: float, ttft: float, amp: float,
            cmds: dict[str, float] | None) -> dict[str, object]:
        return {"system": system, "rate_req_s": 2.0, "hit_rate_gpu": hit,
                "ttft_mean_s": ttft, "read_amplification": amp, "max_hit_rate": 0.9634,
                "extra": {"restore_commands_by_kind": cmds} if cmds else {}}
    meta = {"systems": ["flatcake", "memory-only"], "rates": [2.0]}
    rebuilt = SweepResult([run("flatcake", 0.9633, 0.5, 1.01, {"sliding": 0.0, "c4a": 21.0}),
                           run("memory-only", 0.8, 0.9, math.nan, None)], meta)
    cached = SweepResult([run("flatcake", 0.954, 0.59, 1.02, {"sliding": 2.0, "c4a": 21.0}),
                          run("memory-only", 0.79, 0.95, math.nan, None)], meta)
    lines = windows_table(rebuilt, cached)
    assert lines[0].startswith("## Sliding windows rebuilt by vLLM or prefix-cached")
    assert "| flatcake | 2 | 96.33 | 95.40 | 0.500 | 0.590 | 1.01 | 1.02 | 21.0 | 23.0 |" \
        in lines
    assert "| memory-only | 2 | 80.00 | 79.00 | 0.900 | 0.950 | – | – | – | – |" in lines
    assert "The bound is 96.34%." in lines[2]
    assert windows_table(rebuilt, SweepResult([], meta)) == []
