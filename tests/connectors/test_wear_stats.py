"""The connector's stats carry the node's SSD wear (``Books.ssd_wear``): the bytes
written and read back since the last interval, and the unread bytes now."""

from __future__ import annotations

from pathlib import Path

from tests.connectors.sides_harness import Harness, end, finish, tokens, view


def test_each_interval_reports_the_wear_grown_since_the_last(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    turn0 = list(range(100, 113))  # 3 full blocks + 1 token, on SSD by FIRST_TURN
    finish(h, "a", turn0, [5, 6, 7, 8], out=3, session="s")
    h.step()
    first = h.sched.take_stats()
    wear = h.sched.control.ssd_wear()
    assert first["ssd_written_bytes"] == wear.written_bytes > 0
    assert first["ssd_unread_bytes"] == wear.written_bytes
    assert "ssd_read_bytes" not in first  # nothing read back yet
    # Turn 1 restores turn 0 from the SSD.
    turn1 = tokens(turn0, 8, 200)
    v = view("b", turn1, session="s")
    assert h.sched.num_matched_tokens(v, 0) == (12, True)
    h.sched.after_alloc("b", [20, 21, 22, 23, 24], 12)
    h.step()
    end(h, v)
    second = h.sched.take_stats()
    wear = h.sched.control.ssd_wear()
    assert second["ssd_read_bytes"] == wear.read_bytes > 0
    assert second.get("ssd_written_bytes", 0) == wear.written_bytes - first["ssd_written_bytes"]
    assert second["ssd_unread_bytes"] == wear.unread_bytes
    h.close()
