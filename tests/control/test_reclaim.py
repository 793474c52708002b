"""Reclaim choice: whole sessions, oldest first, pinned skipped, high -> low watermark."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flatcake.control.reclaim import SessionUsage, choose_victims

S = SessionUsage


class TestScenarios:
    def test_nothing_under_the_high_watermark(self) -> None:
        sessions = [S("a", 1.0, False, 50)]
        assert choose_victims(sessions, 90, 100, 0.9, 0.5) == []  # 90 is not > 90

    def test_oldest_first_until_low(self) -> None:
        sessions = [S("new", 30.0, False, 20), S("old", 10.0, False, 20),
                    S("mid", 20.0, False, 20), S("newest", 40.0, False, 35)]
        # used 95 of 100, low 0.6: drop old (75), mid (55 <= 60), stop.
        assert choose_victims(sessions, 95, 100, 0.9, 0.6) == ["old", "mid"]

    def test_pinned_sessions_are_skipped(self) -> None:
        sessions = [S("old", 1.0, True, 60), S("mid", 2.0, False, 10), S("new", 3.0, False, 30)]
        assert choose_victims(sessions, 100, 100, 0.9, 0.7) == ["mid", "new"]

    def test_all_unpinned_when_not_enough(self) -> None:
        sessions = [S("a", 1.0, True, 90), S("b", 2.0, False, 5)]
        assert choose_victims(sessions, 95, 100, 0.9, 0.1) == ["b"]

    def test_sessions_without_bytes_on_the_medium_are_not_victims(self) -> None:
        sessions = [S("empty", 0.0, False, 0), S("a", 1.0, False, 40)]
        assert choose_victims(sessions, 95, 100, 0.9, 0.8) == ["a"]

    def test_ties_broken_by_session_id(self) -> None:
        sessions = [S("b", 1.0, False, 10), S("a", 1.0, False, 10)]
        assert choose_victims(sessions, 100, 100, 0.9, 0.85) == ["a", "b"]

    def test_bad_watermarks(self) -> None:
        with pytest.raises(ValueError, match="low"):
            choose_victims([], 1, 1, 0.5, 0.6)


sessions_st = st.lists(
    st.builds(SessionUsage, st.text("abcdefgh", min_size=1, max_size=3),
              st.floats(0, 100, allow_nan=False), st.booleans(), st.integers(0, 50)),
    max_size=12, unique_by=lambda s: s.session_id)


@given(sessions_st, st.floats(0.05, 1.0), st.floats(0.0, 0.95))
def test_choice_properties(sessions: list[SessionUsage], high: float, low_frac: float) -> None:
    low = high * low_frac
    used = sum(s.bytes for s in sessions)
    cap = 100
    victims = choose_victims(sessions, used, cap, high, low)
    by_id = {s.session_id: s for s in sessions}
    chosen = [by_id[v] for v in victims]
    assert len(set(victims)) == len(victims)
    assert all(not s.pinned and s.bytes > 0 for s in chosen)  # never a pinned session
    if used <= high * cap:
        assert victims == []
        return
    # Oldest last access first.
    assert [(s.last_access, s.session_id) for s in chosen] == sorted(
        (s.last_access, s.session_id) for s in chosen)
    others = [s for s in sessions if not s.pinned and s.bytes > 0 and s not in chosen]
    if chosen:
        assert all((o.last_access, o.session_id) > (chosen[-1].last_access,
                                                    chosen[-1].session_id) for o in others)
        # Minimal: without the last victim use would still be above low.
        assert used - sum(s.bytes for s in chosen[:-1]) > low * cap
    if others:
        assert used - sum(s.bytes for s in chosen) <= low * cap  # stopped at low
