"""The report's window-rule table (``report.window_rules``): each rule's window bytes
against FlatCake's newest-turn-only rule on the same trace and against the same run's
segments with a row at every block, "–" where a system does not count its writes per
layer kind or a saved row lacks the every-block count."""

from __future__ import annotations

from flatcake.report.window_rules import RULES, rules_table, window_bytes


def row(system: str, rule: str, window: int | None,
        every: int | None = None) -> dict[str, object]:
    return {"trace": "t.jsonl", "system": system, "rule": rule, "hit_rate": 0.5,
            "bound": 0.6, "ttft_mean_s": 0.25, "ssd_write_bytes": 2 * 10**12,
            "window_write_bytes": window, "window_every_block_bytes": every}


def test_each_rule_is_set_against_newest_turn_and_every_block() -> None:
    assert RULES[0][0] == "newest turn only"
    assert RULES[-1][0] == "every block"
    # The every-block rule replayed wrote 4x the default's rows, but the default's own
    # segments with a row at every block would hold 8x them: the column says 0.125.
    lines = rules_table([row("flatcake", "newest turn only", 5 * 10**10, 10**12),
                         row("flatcake", "branches + stride 1K (default)", 10**11,
                             8 * 10**11),
                         row("flatcake", "every block", 4 * 10**11, 4 * 10**11),
                         row("tiered-direct", "every block", None),
                         {**row("flatcake", "turn ends", 10**11), "trace": "old.jsonl"}])
    assert "| x newest turn | x every block |" in lines[4]
    body = [line for line in lines if line.startswith("| t.jsonl")]
    assert body[0].endswith("| 0.050 | 1.000 | 0.050 |")
    assert body[1].endswith("| 0.100 | 2.000 | 0.125 |")
    assert body[2].endswith("| 0.400 | 8.000 | 1.000 |")
    assert body[3].endswith("| – | – | – |")
    assert "| 50.00 (60.00) | 0.250 | 2.00 |" in body[0]
    old = next(line for line in lines if line.startswith("| old.jsonl"))
    assert old.endswith("| 0.100 | – | – |")


def test_every_block_count_is_written_plus_saved() -> None:
    extra = {"ssd_written_bytes_by_kind": {"sliding": 0, "c4a": 700, "c4a-state": 30,
                                           "c128a-state": 50},
             "ssd_saved_by_windows_bytes": 920}
    assert window_bytes(extra, {"sliding", "c4a-state", "c128a-state"}) == (80, 1000)
    assert window_bytes({"ssd_written_bytes_by_kind": {"c4a": 1}}, {"c4a"}) == (1, None)
    assert window_bytes({}, {"c4a-state"}) == (None, None)
