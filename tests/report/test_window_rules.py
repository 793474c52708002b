"""The report's window-rule table (``report.window_rules``): each rule's window bytes
against FlatCake's every-block rule on the same trace, "–" where a system does not count
its writes per layer kind."""

from __future__ import annotations

from flatcake.report.window_rules import RULES, rules_table


def row(system: str, rule: str, window: int | None) -> dict[str, object]:
    return {"trace": "t.jsonl", "system": system, "rule": rule, "hit_rate": 0.5,
            "bound": 0.6, "ttft_mean_s": 0.25, "ssd_write_bytes": 2 * 10**12,
            "window_write_bytes": window}


def test_each_rule_is_set_against_every_block() -> None:
    assert [name for name, _ in RULES][-1] == "every block"
    lines = rules_table([row("flatcake", "turn ends", 10**11),
                         row("flatcake", "every block", 10**12),
                         row("tiered-direct", "every block", None)])
    body = [line for line in lines if line.startswith("| t.jsonl")]
    assert body[0].endswith("| 0.100 | 0.100 |")
    assert body[1].endswith("| 1.000 | 1.000 |")
    assert body[2].endswith("| – | – |")
    assert "| 50.00 (60.00) | 0.250 | 2.00 |" in body[0]
