"""Offered load: the arrival model delivers the requested rate, saturation is reported,
and the node's occupancy (queues, busy GPU) is measured."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from flatcake.replay.node.arrivals import session_schedule, window_rate
from flatcake.replay.node.occupancy import BusyTracker, LevelTracker, level_stats
from flatcake.replay.simulate import replay_node, run_replay
from flatcake.replay.workload.trace import from_requests, from_sessions
from tests.replay.helpers import GEOMETRY, ids, tiny_preset

BT = GEOMETRY.tokens_per_block


def _long_sessions(num: int, turns: int, think_s: float) -> list[list[tuple[list[int], int,
                                                                              int, float]]]:
    """``num`` sessions of ``turns`` turns, each turn re-reading the history plus 2 blocks."""
    out = []
    for _ in range(num):
        reqs = []
        for t in range(turns):
            blocks = ids(0, 4 + 2 * t)
            reqs.append((blocks, len(blocks) * BT, 8, think_s))
        out.append(reqs)
    return out


def test_level_tracker_time_weighted_mean_and_p99() -> None:
    q = LevelTracker()
    q.change(0.0, 1)   # level 1 during [0, 90)
    q.change(90.0, 2)  # level 3 during [90, 100)
    q.close(100.0)
    mean, p99 = level_stats([q])
    assert mean == pytest.approx((1 * 90 + 3 * 10) / 100)
    assert p99 == 3
    with pytest.raises(ValueError):
        q.change(100.0, -4)


def test_busy_tracker_counts_overlaps_once() -> None:
    b = BusyTracker()
    b.hold(1.0)
    b.hold(2.0)
    b.release(3.0)
    b.release(5.0)
    assert b.busy_s == pytest.approx(4.0)


def test_schedule_offers_the_requested_rate_where_naive_starts_would_not() -> None:
    # 40 sessions x 20 turns with 30 s think times: a session lasts about 10 minutes,
    # not short against the naive span of session starts at 1 req/s (800 requests /
    # 1 = 800 s), so naive starts would offer well under the rate.
    wl = from_sessions(_long_sessions(40, 20, 30.0), BT)
    preset = tiny_preset()
    s = session_schedule(wl, 1.0, 600.0, preset.node.gpu, GEOMETRY.bytes_per_token, seed=3)
    assert not s.unreachable
    assert s.offered_req_s == pytest.approx(1.0, rel=0.01)
    naive_starts = np.cumsum(np.random.default_rng(3).exponential(1 / (1.0 * 40 / 800), 40))
    naive = np.concatenate([st + 30.0 * np.arange(20) for st in naive_starts])
    assert window_rate(naive) < 0.9  # more than 10% short
    # Think times above the cap are cut to it.
    s2 = session_schedule(wl, 1.0, 10.0, preset.node.gpu, GEOMETRY.bytes_per_token, seed=3)
    assert s2.think_s.max() == pytest.approx(10.0)


def test_a_rate_the_trace_cannot_offer_is_reported_unreachable() -> None:
    wl = from_sessions(_long_sessions(3, 20, 30.0), BT)
    m = run_replay(wl, "memory-only", 50.0, tiny_preset(gpu_blocks=200))
    assert m.load_status == "unreachable"
    assert m.offered_req_s < 50.0 * 0.95


def test_delivered_matches_requested_below_saturation_and_drops_above() -> None:
    wl = from_sessions(_long_sessions(40, 20, 30.0), BT)
    fast = tiny_preset(gpu_blocks=400)
    m = run_replay(wl, "memory-only", 1.0, fast)
    assert m.load_status == "ok"
    assert m.throughput_req_s == pytest.approx(1.0, rel=0.05)
    assert m.queue_mean < 0.5
    # A GPU 1000x slower (10 tokens/s of prefill, 1 s per decode step) cannot keep up.
    slow_gpu = dataclasses.replace(fast.node.gpu, prefill_tokens_per_s=10.0,
                                   decode_step_base_s=1.0)
    slow = dataclasses.replace(fast, node=dataclasses.replace(fast.node, gpu=slow_gpu))
    s = run_replay(wl, "memory-only", 1.0, slow)
    assert s.load_status == "saturated"
    assert s.throughput_req_s < 1.0 * 0.95
    assert s.queue_mean > m.queue_mean
    assert s.gpu_busy_frac > m.gpu_busy_frac


def test_a_prefill_holds_back_the_decode_batch_of_its_gpu() -> None:
    # A decodes 1000 tokens (1 ms a step); B, arriving during A's decode, prefills 64
    # blocks (1024 tokens at 10K tokens/s = 0.1 s). A finishes that much later.
    a_alone = [(0.0, ids(0, 2), 2 * BT, 1000)]
    both = [*a_alone, (0.2, ids(100, 164), 64 * BT, 2)]
    preset = tiny_preset(gpu_blocks=400)
    _, n1 = replay_node(from_requests(a_alone, BT), "memory-only", 1.0, preset)
    _, n2 = replay_node(from_requests(both, BT), "memory-only", 1 / 0.2, preset)
    prefill_b = preset.node.gpu.prefill_time_s(64 * BT, 0) + preset.node.gpu.decode_step_s(
        1, 2 * BT * GEOMETRY.bytes_per_token)
    delay = n2.rec.done_s[0] - n1.rec.done_s[0]
    assert delay == pytest.approx(prefill_b, rel=1e-6)
