"""The claims table marks a paper claim reproduced only inside its stated tolerance."""

from __future__ import annotations

from typing import Any

from flatcake.replay.results import SweepResult
from flatcake.report.claims import claims_table


def _run(system: str, rate: float, hit: float, **kw: Any) -> dict[str, Any]:
    base = {"system": system, "rate_req_s": rate, "hit_rate_gpu": hit, "max_hit_rate": 0.96,
            "ttft_mean_s": 1.0, "ttft_p99_s": 5.0, "prefetch_time_mean_s": 0.1,
            "ssd_read_gbps_per_worker": 5.0, "read_amplification": 1.0, "extra": {},
            "queue_mean": 0.0}
    return {**base, **kw}


def _cc(tiered_hit: float) -> SweepResult:
    runs = []
    for rate in (0.1, 0.5, 1.0):
        runs += [_run("flatcake", rate, 0.958),
                 _run("tiered", rate, tiered_hit, read_amplification=6.6),
                 _run("tiered-wait", rate, 0.95, ssd_read_gbps_per_worker=2.6,
                      prefetch_time_mean_s=0.1 * (1 + 10 * rate)),
                 _run("memory-only", rate, tiered_hit - 0.11)]
    return SweepResult(runs, {"systems": ["flatcake", "tiered", "tiered-wait", "memory-only"],
                              "rates": [0.1, 0.5, 1.0]})


def _verdicts(lines: list[str]) -> list[str]:
    return [line.split(" | ")[1] for line in lines if line.startswith("| ") and
            not line.startswith("| claim")]


def test_claims_inside_tolerance_are_reproduced_and_outside_are_not() -> None:
    v = _verdicts(claims_table(_cc(0.6426), [], {}))
    # hit within max, tiered falls to ~64%, ~11 pt over memory-only, prefetch shape,
    # 1.9x bandwidth, amplification >= 5x; the ablation and llama were not run.
    assert v[:6] == ["reproduced"] * 6
    assert v[6:] == ["not measured", "not measured"]
    far = _verdicts(claims_table(_cc(0.90), [], {}))
    assert far[1] == "**not reproduced**"  # tiered at 90%, not ~64%
    assert far[2] == "reproduced"  # memory-only still 11 pt below


def test_amplification_names_the_rates_where_it_holds() -> None:
    cc = _cc(0.6426)
    for r in cc.runs:
        if r["system"] == "tiered":
            r["read_amplification"] = {0.1: 1.2, 0.5: 6.6, 1.0: 2.0}[r["rate_req_s"]]
    row = next(line for line in claims_table(cc, [], {}) if "restored byte" in line)
    assert "(at least 5x at some load) | reproduced | at least 5x at 0.5 req/s (6.60x);" \
        in row
    for r in cc.runs:
        if r["system"] == "tiered":
            r["read_amplification"] = 4.9
    row = next(line for line in claims_table(cc, [], {}) if "restored byte" in line)
    assert "| **not reproduced** | at least 5x at no rate;" in row
