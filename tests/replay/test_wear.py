"""SSD wear in the replay: exact bytes written and never read, today's rule against
``placement.not_yet`` (and its write-back at reclaim), on hand-worked workloads."""

from __future__ import annotations

import dataclasses
import math

from flatcake.layout import SegmentLayout
from flatcake.replay.node.metrics import RunMetrics, drive_writes_per_day, format_metrics
from flatcake.replay.node.node import Node
from flatcake.replay.simulate import replay_node
from flatcake.replay.workload.trace import from_sessions
from tests.replay.helpers import GEOMETRY, ids, tiny_preset

BT = GEOMETRY.tokens_per_block
# Session 0 ends after one turn of 4 blocks; session 1 continues (a 600-token reply:
# neither short nor long) with 4 more. The GPU holds everything, so no restore reads.
SESSIONS = [[(ids(0, 4), 4 * BT, 600, 0.0)],
            [(ids(100, 104), 4 * BT, 600, 0.0), (ids(100, 108), 8 * BT, 10, 1.0)]]


def _ssd(blocks: int) -> int:
    return SegmentLayout.for_ssd(blocks, GEOMETRY.layer_block_bytes).total_bytes


def _run(not_yet: bool) -> tuple[RunMetrics, Node]:
    preset = tiny_preset(gpu_blocks=400)
    fc = preset.flatcake
    preset = dataclasses.replace(preset, flatcake=dataclasses.replace(
        fc, placement=dataclasses.replace(fc.placement, not_yet=not_yet)))
    return replay_node(from_sessions(SESSIONS, BT), "flatcake", 1.0, preset)


def test_todays_rule_writes_every_turn_and_none_is_read() -> None:
    m, node = _run(False)
    assert m.ssd_write_bytes == 2 * _ssd(4) + _ssd(4)
    assert m.ssd_read_bytes == 0 and m.ssd_never_read_bytes == m.ssd_write_bytes
    assert node.system.cp.ssd_wear().written_bytes == m.ssd_write_bytes


def test_not_yet_writes_only_the_session_that_continued() -> None:
    m, _ = _run(True)
    assert m.placements["not_yet"] == 2 and m.placements["default"] == 1
    # Session 1's two turns in one segment; session 0's turn never.
    assert m.ssd_write_bytes == _ssd(8)
    assert m.ssd_never_read_bytes == _ssd(8)
    assert m.hit_rate_gpu == _run(False)[0].hit_rate_gpu


def test_drive_writes_per_day_and_the_printed_line() -> None:
    assert drive_writes_per_day(4e12, 86400.0, 4 * 10**12) == 1.0
    assert drive_writes_per_day(2e12, 43200.0, 2 * 10**12) == 2.0
    assert math.isnan(drive_writes_per_day(1.0, 0.0, 10))
    m, _ = _run(True)
    text = format_metrics(dataclasses.replace(m, drive_bytes=10**12))
    assert f"written {m.ssd_write_bytes / 1e9:,.1f} GB" in text
    assert "on a 1 TB drive" in text


# Session 0's first turn (4 blocks) comes back 30 s later with 4 more; session 1's one
# turn of 80 blocks fills host memory in between and pushes session 0 out of the GPU.
# No reply is short (the short-reply rule off), so every later turn is SSD-bound.
FILL = [[(ids(0, 4), 4 * BT, 10, 0.0), (ids(0, 8), 8 * BT, 10, 30.0)],
        [(ids(100, 180), 80 * BT, 10, 0.0)]]


def _fill(host_blocks: int, not_yet: bool, write_back: bool) -> RunMetrics:
    preset = tiny_preset(gpu_blocks=84, host_blocks=host_blocks)
    fc = preset.flatcake
    placement = dataclasses.replace(fc.placement, short_reply_threshold_tokens=0,
                                    not_yet=not_yet, not_yet_write_back=write_back)
    preset = dataclasses.replace(preset, flatcake=dataclasses.replace(
        fc, placement=placement))
    return replay_node(from_sessions(FILL, BT), "flatcake", 1.0, preset)[0]


def test_a_not_yet_turn_reclaim_would_drop_is_written_back_and_hit() -> None:
    today = _fill(82, False, False)
    dropped = _fill(82, True, False)
    back = _fill(82, True, True)
    # Session 0's 4 blocks are a hit when its chat comes back: from the SSD, as with
    # today's rule; without the write-back reclaim dropped them (a miss).
    assert today.hit_rate_gpu == back.hit_rate_gpu == 4 / 92
    assert dropped.hit_rate_gpu == 3 / 92
    # Written back (4 blocks), then the continuation's 4 new blocks; session 1's turn
    # to the SSD (memory full): what today's rule writes.
    assert back.ssd_write_bytes == today.ssd_write_bytes == 2 * _ssd(4) + _ssd(80)
    assert back.ssd_read_bytes == today.ssd_read_bytes > 0


def test_with_room_in_memory_nothing_is_written_back() -> None:
    back = _fill(100, True, True)
    # Session 0's two turns in one segment when it continues; session 1's never.
    assert back.ssd_write_bytes == _ssd(8)
    assert back.hit_rate_gpu == _fill(100, False, False).hit_rate_gpu
