"""Placement: the DESIGN.md rule order, checked exhaustively over a signal grid."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import pytest

from flatcake.config import PlacementConfig
from flatcake.control.address import Medium
from flatcake.control.placement import (
    Placement,
    PlacementRule,
    PlacementSignals,
    decide_placement,
    explain,
)

CFG = PlacementConfig(agent_context_threshold_tokens=1000, long_reply_threshold_tokens=300,
                      short_reply_threshold_tokens=100, shared_refcount_threshold=2)

NOT_YET_CFG = dataclasses.replace(CFG, not_yet=True)
# The shared-prefix rule at a higher threshold, and off (its default): a shared turn takes
# the later rules, but is never deferred (NOT_YET).
SHARED_CFGS = [dataclasses.replace(c, shared_refcount_threshold=t)
               for c in (CFG, NOT_YET_CFG) for t in (3, 0)]

# The DESIGN.md list, written as data: (rule, condition, medium), in order, for ``cfg``
# (its thresholds; the shared-prefix rule only when on, NOT_YET only with ``not_yet``).
Rule = tuple[PlacementRule, Callable[[PlacementSignals], bool], Medium]


def design_order(cfg: PlacementConfig) -> list[Rule]:
    order: list[Rule] = [
        (PlacementRule.MEMORY_FULL, lambda s: s.memory_full, Medium.SSD),
        (PlacementRule.SHARED_PREFIX,
         lambda s: s.shared_refcount >= cfg.shared_refcount_threshold, Medium.MEMORY),
        (PlacementRule.NOT_YET, lambda s: s.turn_index == 0 and s.shared_refcount <= 1
         and s.context_tokens <= cfg.agent_context_threshold_tokens, Medium.MEMORY),
        (PlacementRule.FIRST_TURN, lambda s: s.turn_index == 0, Medium.SSD),
        (PlacementRule.AGENT_CONTEXT,
         lambda s: s.context_tokens > cfg.agent_context_threshold_tokens, Medium.SSD),
        (PlacementRule.LONG_REPLY,
         lambda s: s.prev_reply_tokens is not None
         and s.prev_reply_tokens > cfg.long_reply_threshold_tokens, Medium.SSD),
        (PlacementRule.SHORT_REPLY,
         lambda s: s.prev_reply_tokens is not None
         and s.prev_reply_tokens < cfg.short_reply_threshold_tokens, Medium.MEMORY),
        (PlacementRule.DEFAULT, lambda s: True, Medium.SSD),
    ]
    return [r for r in order
            if (r[0] != PlacementRule.SHARED_PREFIX or cfg.shared_refcount_threshold)
            and (r[0] != PlacementRule.NOT_YET or cfg.not_yet)]


GRID = list(itertools.product(
    [False, True],  # memory_full
    [0, 1, 2, 9],  # shared_refcount
    [0, 1, 5],  # turn_index
    [0, 999, 1000, 1001, 50_000],  # context_tokens, around the agent threshold
    [None, 0, 99, 100, 200, 300, 301, 10_000],  # prev_reply_tokens, around both thresholds
))


class TestRuleTable:
    def test_every_grid_point_takes_the_first_matching_rule(self) -> None:
        fired: set[PlacementRule] = set()
        for cfg in (CFG, NOT_YET_CFG, *SHARED_CFGS):
            order = design_order(cfg)
            for mf, ref, turn, ctx, reply in GRID:
                s = PlacementSignals(mf, ref, turn, ctx, reply)
                rule, _, medium = next(r for r in order if r[1](s))
                assert decide_placement(s, cfg) == Placement(medium, rule), (cfg, s)
                fired.add(rule)
        assert fired == set(PlacementRule)  # the grid reaches every rule

    @pytest.mark.parametrize(
        ("signals", "medium", "rule"),
        [
            # memory full beats a shared system prompt
            (PlacementSignals(True, 5, 3, 10, 10), Medium.SSD, PlacementRule.MEMORY_FULL),
            # a shared system prompt goes to memory even on a first turn
            (PlacementSignals(False, 2, 0, 10, None), Medium.MEMORY,
             PlacementRule.SHARED_PREFIX),
            (PlacementSignals(False, 1, 0, 10, None), Medium.SSD, PlacementRule.FIRST_TURN),
            # an agent session with a short reply still goes to SSD
            (PlacementSignals(False, 1, 4, 40_000, 20), Medium.SSD,
             PlacementRule.AGENT_CONTEXT),
            # context exactly at the threshold is not "longer than" it
            (PlacementSignals(False, 1, 4, 1000, 20), Medium.MEMORY,
             PlacementRule.SHORT_REPLY),
            (PlacementSignals(False, 1, 4, 500, 301), Medium.SSD, PlacementRule.LONG_REPLY),
            (PlacementSignals(False, 1, 4, 500, 300), Medium.SSD, PlacementRule.DEFAULT),
            (PlacementSignals(False, 1, 4, 500, 100), Medium.SSD, PlacementRule.DEFAULT),
            (PlacementSignals(False, 1, 4, 500, 99), Medium.MEMORY, PlacementRule.SHORT_REPLY),
            # a later turn without a known reply falls through to the default
            (PlacementSignals(False, 1, 4, 500, None), Medium.SSD, PlacementRule.DEFAULT),
            # refcount 0 and 1 are both "not shared"
            (PlacementSignals(False, 0, 0, 10, None), Medium.SSD, PlacementRule.FIRST_TURN),
        ],
    )
    def test_hand_written_cases(self, signals: PlacementSignals, medium: Medium,
                                rule: PlacementRule) -> None:
        assert decide_placement(signals, CFG) == Placement(medium, rule)

    def test_the_shared_prefix_rule_is_off_by_default(self) -> None:
        # A first turn nine live requests share: homed on SSD (its memory copy serves
        # them), never deferred; the paper's rule (any sharing) homes it in memory.
        s = PlacementSignals(False, 9, 0, 10, None)
        default = PlacementConfig()
        assert decide_placement(s, default) == Placement(Medium.SSD, PlacementRule.FIRST_TURN)
        assert decide_placement(s, dataclasses.replace(default, not_yet=True)).rule == \
            PlacementRule.FIRST_TURN
        assert decide_placement(s, dataclasses.replace(default, shared_refcount_threshold=2)) \
            == Placement(Medium.MEMORY, PlacementRule.SHARED_PREFIX)
        assert decide_placement(s, dataclasses.replace(default, shared_refcount_threshold=10)) \
            == Placement(Medium.SSD, PlacementRule.FIRST_TURN)
        with pytest.raises(ValueError, match="shared_refcount_threshold"):
            PlacementConfig(shared_refcount_threshold=1)

    def test_thresholds_come_from_config(self) -> None:
        s = PlacementSignals(False, 1, 2, 5000, 50)
        assert decide_placement(s, CFG).rule == PlacementRule.AGENT_CONTEXT
        loose = PlacementConfig(agent_context_threshold_tokens=10_000,
                                short_reply_threshold_tokens=512)
        assert decide_placement(s, loose).rule == PlacementRule.SHORT_REPLY


class TestExplain:
    def test_names_medium_rule_and_values(self) -> None:
        text = explain(PlacementSignals(False, 1, 4, 40_000, 20), CFG)
        assert text.startswith("ssd by agent_context")
        assert "context_tokens=40000" in text and "1000" in text

    def test_every_rule_explained(self) -> None:
        seen = set()
        for (mf, ref, turn, ctx, reply), cfg in itertools.product(GRID, (CFG, NOT_YET_CFG)):
            s = PlacementSignals(mf, ref, turn, ctx, reply)
            d = decide_placement(s, cfg)
            text = explain(s, cfg)
            assert f"by {d.rule.value}:" in text
            assert text.startswith(d.medium.name.lower())
            seen.add(d.rule)
        assert seen == set(PlacementRule)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"shared_refcount": -1}, "shared_refcount"),
        ({"turn_index": -2}, "turn_index"),
        ({"context_tokens": 1.5}, "context_tokens"),
        ({"prev_reply_tokens": -3}, "prev_reply_tokens"),
        ({"turn_index": True}, "turn_index"),
    ],
)
def test_bad_signals_name_the_field(kwargs: dict[str, object], needle: str) -> None:
    args: dict[str, object] = {"memory_full": False, "shared_refcount": 1, "turn_index": 1,
                               "context_tokens": 10, "prev_reply_tokens": None}
    args.update(kwargs)
    with pytest.raises(ValueError, match=needle):
        PlacementSignals(**args)  # type: ignore[arg-type]
