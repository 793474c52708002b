"""Not-yet homes written back at memory reclaim (``placement.not_yet_write_back``) by the
connector's halves: the scheduler half hands each write-back to the workers as a store
(``StorePlan.home``), the worker writes it from its arena, and a later turn restores
those bytes from the SSD; the stats count it, and no engine request waits for it."""

from __future__ import annotations

from pathlib import Path

from flatcake.config import FlatCakeConfig
from flatcake.control.address import Medium
from tests.connectors.sides_harness import Harness, finish, settings, tokens, view

SESSIONS = 8


def write_back_settings(*more: str) -> FlatCakeConfig:
    # 8 pages of host memory, reclaim from 0.9 down to 0.5; a turn of 2 blocks is one
    # page: the 8th first turn crosses the high watermark, the 4 oldest are written back.
    return settings("store.memory_capacity_bytes=32768", "reclaim.memory_high=0.9",
                    "reclaim.memory_low=0.5", "placement.not_yet=true",
                    "placement.not_yet_write_back=true", *more)


def first_turns(h: Harness) -> list[list[int]]:
    """One not-yet first turn per session (2 full blocks + 1 token in slots 2i, 2i+1),
    each written in its own step; returns their tokens."""
    out = []
    for i in range(SESSIONS):
        toks = list(range(1000 * (i + 1), 1000 * (i + 1) + 9))
        p = finish(h, f"r{i}", toks, [2 * i, 2 * i + 1], out=3, session=f"s{i}")
        assert p["placement"] == "memory:not_yet"
        h.step()
        out.append(toks)
    return out


def restore_first(h: Harness, turn: list[int], from_ssd: bool) -> None:
    """Session 0's second turn restores its first turn (slots 0, 1) into slots 40, 41
    (async when it reads the SSD): the same bytes."""
    v = view("b", tokens(turn, 8, 200), session="s0")
    assert h.sched.num_matched_tokens(v, 0) == (8, from_ssd)
    h.sched.after_alloc("b", [40, 41, 42, 43], 8)
    h.step()
    assert all(h.block(layer, 40 + j) == h.block(layer, j)
               for layer in range(len(h.kv)) for j in range(2))


def test_the_workers_write_a_home_back_and_a_later_turn_restores_it(tmp_path: Path) -> None:
    h = Harness(tmp_path, write_back_settings())
    turns = first_turns(h)
    assert h.sched.num_pending_stores() == 0 and h.worker.pending() == 0
    ctl = h.sched.control
    for i in range(SESSIONS):
        hit = ctl.lookup(view("x", turns[i]).keys)
        assert (hit.num_blocks, hit.num_ssd_blocks) == (2, 2 if i < 4 else 0)
    segs = [ctl.segment(j) for i in range(4) for j in ctl.session(f"s{i}").ssd_segment_ids]
    assert [s.medium for s in segs] == [Medium.SSD] * 4
    stats = h.sched.take_stats()
    assert stats["write_backs"] == 4
    assert stats["ssd_written_bytes"] == sum(s.total_bytes for s in segs) > 0
    assert ctl.memory_used_bytes == 4 * 4096
    # Session 0's next turn restores its first turn from the SSD.
    restore_first(h, turns[0], from_ssd=True)
    ctl.check_integrity()
    h.close()


def test_a_write_back_the_workers_fail_leaves_the_home_served(tmp_path: Path) -> None:
    h = Harness(tmp_path, write_back_settings())

    def no_space(*_a: object, **_k: object) -> None:
        raise OSError(28, "No space left on device")

    h.worker.executor.writer.write_ssd_from_memory = no_space  # type: ignore[method-assign]
    turns = first_turns(h)
    ctl = h.sched.control
    assert h.sched.take_stats()["stores_failed"] == 4
    for toks in turns:
        hit = ctl.lookup(view("x", toks).keys)
        assert (hit.num_blocks, hit.num_memory_blocks) == (2, 2)
    assert ctl.ssd_wear().written_bytes == 0
    # Session 0's next turn restores its first turn from its memory home.
    restore_first(h, turns[0], from_ssd=False)
    ctl.check_integrity()
    h.close()
