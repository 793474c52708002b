"""Hand-worked scenarios, one mechanism at a time, for every system.

Global-clock workloads keep their recorded arrival times when replayed at their own
rate ``(n - 1) / span``; each request is small enough to finish before the next.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from flatcake.config import PlacementConfig
from flatcake.replay.simulate import replay_node, run_replay
from flatcake.replay.workload.trace import from_requests, from_sessions
from tests.replay.helpers import BLOCK_BYTES, GEOMETRY, ids, tiny_preset

BT = GEOMETRY.tokens_per_block


def _req(t: float, blocks: list[int], out: int = 2) -> tuple[float, list[int], int, int]:
    return (t, blocks, len(blocks) * BT, out)


def _own_rate(reqs: list[tuple[float, list[int], int, int]]) -> float:
    return (len(reqs) - 1) / (reqs[-1][0] - reqs[0][0])


# Three requests fill the store (A, B, C: 10 blocks each), then A and B come back at
# the same instant, each extended by two blocks. With a GPU pool of 12 blocks and a host
# tier of 10 blocks, only C is still in GPU/host memory: A and B must come from SSD.
TWO_RESTORES = [
    _req(0.0, ids(0, 10)), _req(1.0, ids(100, 110)), _req(2.0, ids(200, 210)),
    _req(10.0, ids(0, 12)), _req(10.0, ids(100, 112)),
]


def _two_restores(system: str, host_blocks_override: int = 10,
                  **preset_kw: int) -> tuple[np.ndarray, object]:
    wl = from_requests(TWO_RESTORES, BT)
    preset = tiny_preset(gpu_blocks=14, host_blocks=host_blocks_override, **preset_kw)
    m, node = replay_node(wl, system, _own_rate(TWO_RESTORES), preset)
    return node.rec.hit_blocks.copy(), m


def test_tiered_best_effort_uses_only_the_batches_finished_when_scheduled() -> None:
    # One prefetch thread: A's batch is being read when A is scheduled at once (the
    # engine is idle), so A's prefetch is terminated, its batch read and thrown away;
    # B is scheduled after A's prefill, by when its own batch has finished.
    hits, m = _two_restores("tiered")
    assert hits[3:].tolist() == [0, 10]
    ex = m.extra  # type: ignore[attr-defined]
    assert ex["prefetch_issued"] == 2
    assert ex["prefetch_terminated"] == 1
    assert ex["prefetch_terminated_blocks"] == 10
    assert ex["prefetch_terminated_batch_bytes"] == 10 * BLOCK_BYTES
    assert m.prefetch_cancellations == 1  # type: ignore[attr-defined]
    assert m.read_commands == 20  # type: ignore[attr-defined]  # one per object
    assert m.read_amplification == pytest.approx(2.0)  # type: ignore[attr-defined]


def test_tiered_wait_complete_uses_every_ssd_hit() -> None:
    # B comes 0.5 s after A, when A's host-pool reservation (the whole 10-block pool of
    # the one engine) has been released by A's scheduling.
    reqs = [*TWO_RESTORES[:4], _req(10.5, ids(100, 112))]
    wl = from_requests(reqs, BT)
    m, node = replay_node(wl, "tiered-wait", 1 / 0.5, tiny_preset(gpu_blocks=14,
                                                                  host_blocks=10))
    assert node.rec.hit_blocks[3:].tolist() == [10, 10]
    assert m.prefetch_cancellations == 0
    assert m.read_amplification == pytest.approx(1.0)
    # A waited for its prefetch (one 10-object batch) before its prefill.
    batch_s = 0.0005 + 10 * BLOCK_BYTES / 1e9
    assert node.rec.first_token_s[3] - node.rec.arrival_s[3] > batch_s


def test_tiered_prefetch_budget_refuses_and_truncates() -> None:
    # Host pool of 8 blocks (one worker): A needs 10, gets 8 (truncated); its 8 reserved
    # blocks pass half the pool, so B, arriving with A, is refused (rate limited) and
    # keeps only the 3 blocks still in the GPU's prefix cache.
    hits, m = _two_restores("tiered-wait", host_blocks_override=8)
    ex = m.extra  # type: ignore[attr-defined]
    assert ex["prefetch_truncated_blocks"] == 2
    assert ex["prefetch_rate_limited"] == 1
    assert hits[3:].tolist() == [8, 3]


@pytest.mark.parametrize(("system", "qd"), [("tiered", 1), ("tiered-uring", 8)])
def test_tiered_reads_a_batch_one_pread_at_a_time_unless_io_uring(system: str,
                                                                  qd: int) -> None:
    wl = from_requests(TWO_RESTORES, BT)
    preset = tiny_preset(gpu_blocks=14, host_blocks=10, command_latency_s=1e-3)
    preset = dataclasses.replace(preset, node=dataclasses.replace(
        preset.node, ssd=dataclasses.replace(preset.node.ssd, queue_depth=8)))
    _, node = replay_node(wl, system, _own_rate(TWO_RESTORES), preset)
    batch_s = 0.0005 + 10 * 1e-3 / qd + 10 * BLOCK_BYTES / 1e9
    assert node.rec.ssd_read_busy_s == pytest.approx(2 * batch_s)


def test_tiered_direct_never_cancels_and_reads_per_block_per_layer() -> None:
    hits, m = _two_restores("tiered-direct")
    assert m.prefetch_cancellations == 0  # type: ignore[attr-defined]
    assert hits[3:].tolist() == [10, 10]
    assert m.read_commands == 2 * 10 * GEOMETRY.num_layers  # type: ignore[attr-defined]


def test_memory_only_loses_what_the_host_tier_dropped() -> None:
    hits, m = _two_restores("memory-only")
    assert hits[3:].tolist() == [0, 0]
    assert m.read_commands == 0  # type: ignore[attr-defined]


def test_flatcake_restores_wait_for_a_slot_and_never_cancel() -> None:
    wl = from_requests(TWO_RESTORES, BT)
    preset = tiny_preset(gpu_blocks=14, host_blocks=10, slots=1,
                         ssd_read_bytes_per_s=1e7)
    m, node = replay_node(wl, "flatcake", _own_rate(TWO_RESTORES), preset)
    rec = node.rec
    assert rec.hit_blocks[3:].tolist() == [10, 10]
    assert m.prefetch_cancellations == 0
    # One slot: B's restore starts when A's ends, so B waits at least a whole restore.
    a, b = sorted(rec.prefetch_s)
    assert b >= 2 * a * 0.99
    # Each restore reads one segment of 10 blocks: one command per layer.
    assert m.read_commands == 2 * GEOMETRY.num_layers
    assert m.read_amplification == pytest.approx(1.0)


def test_tiered_buckets_are_recycled_fifo_and_cut_prefixes() -> None:
    # SSD budget of 10 objects, buckets of 10: demoting B (when C enters host memory)
    # recycles A's bucket. Two workers (round robin) so A and B restore side by side.
    wl = from_requests(TWO_RESTORES, BT)
    preset = tiny_preset(workers=2, gpu_blocks=14, host_blocks=10, ssd_blocks=10,
                         bucket_keys=10)
    m, node = replay_node(wl, "tiered-direct", _own_rate(TWO_RESTORES), preset)
    assert node.rec.hit_blocks[3] == 0  # A's bucket was recycled
    assert node.rec.hit_blocks[4] == 10  # B restored from its bucket
    assert m.extra["buckets_recycled"] >= 1
    assert m.extra["blocks_lost_to_recycling"] >= 10


def test_one_queue_makes_a_memory_request_wait_behind_a_restore() -> None:
    # X is restored from SSD (slow: 10 MB/s); Y, a new prompt, arrives just after.
    reqs = [_req(0.0, ids(0, 50)), _req(1.0, ids(300, 350)), _req(5.0, ids(0, 51)),
            _req(5.001, ids(500, 505))]
    wl = from_requests(reqs, BT)
    ttft = {}
    for system in ("flatcake", "flatcake-1q"):
        preset = tiny_preset(gpu_blocks=60, ssd_read_bytes_per_s=1e7)
        _, node = replay_node(wl, system, _own_rate(reqs), preset)
        t = node.rec.first_token_s - node.rec.arrival_s
        ttft[system] = t
        assert node.rec.hit_blocks[2] == 50
    restore_s = 50 * GEOMETRY.block_bytes / 1e7
    assert ttft["flatcake"][3] < 0.02  # runs at once
    assert ttft["flatcake-1q"][3] > restore_s * 0.9  # waited behind X's restore


def test_max_hit_rate_is_the_infinite_cache_prefix_bound() -> None:
    reqs = [_req(0.0, [0, 1, 2]), _req(1.0, [0, 1, 2, 3]), _req(2.0, [0, 9])]
    m = run_replay(from_requests(reqs, BT), "memory-only", _own_rate(reqs), tiny_preset())
    assert m.max_hit_rate == pytest.approx((0 + 3 + 1) / 9)
    assert m.hit_rate_gpu == pytest.approx(m.max_hit_rate)


def test_flatcake_places_turns_by_rule() -> None:
    # Turn 0 -> first_turn (SSD); turn 1 after a 100-token reply -> short_reply
    # (memory); turn 2 after a 3000-token reply -> long_reply (SSD).
    session = [(ids(0, 4), 4 * BT, 100, 0.0), (ids(0, 8), 8 * BT, 3000, 1.0),
               (ids(0, 12), 12 * BT, 10, 1.0)]
    m = run_replay(from_sessions([session], BT), "flatcake", 1.0, tiny_preset(gpu_blocks=400))
    assert m.placements["first_turn"] == 1
    assert m.placements["short_reply"] == 1
    assert m.placements["long_reply"] == 1


def test_flatcake_keeps_a_duplicated_turn_when_memory_fills() -> None:
    """Three prompts of 10 blocks, each sent twice at once (a retry): when the first of a
    pair is stored, the second holds its blocks. Host memory holds 30 blocks, copies up to
    0.9 of it (the default placement). A's prompt returns, extended, after the three pairs.
    With the shared-prefix rule off (the default) each pair's turn is homed on SSD with a
    memory copy: A is restored whole, as by tiered-direct (whose host tier demotes to its
    SSD). The paper's rule homes the three turns in memory, 30 blocks over the 0.9 high
    watermark: reclaim drops A's, and only what the GPU still caches (2 blocks) is hit."""
    reqs = [r for k in range(3) for r in (_req(float(k), ids(100 * k, 100 * k + 10)),) * 2]
    reqs.append(_req(10.0, ids(0, 12)))
    wl = from_requests(reqs, BT)
    base = tiny_preset(gpu_blocks=24, host_blocks=30)
    got = {}
    for threshold in (0, 2):
        placement = PlacementConfig(shared_refcount_threshold=threshold)
        preset = dataclasses.replace(base, flatcake=dataclasses.replace(
            base.flatcake, placement=placement))
        m, node = replay_node(wl, "flatcake", _own_rate(reqs), preset)
        got[threshold] = (node.rec.hit_blocks.tolist(), m.placements["shared_prefix"],
                          m.extra["sessions_reclaimed_memory"])
    assert got[0] == ([0, 10, 0, 10, 0, 10, 10], 0, 0)
    assert got[2] == ([0, 10, 0, 10, 0, 10, 2], 3, 1)
    _, node = replay_node(wl, "tiered-direct", _own_rate(reqs), base)
    assert node.rec.hit_blocks[-1] == 10


def _sessions(seed: int) -> list[list[tuple[list[int], int, int, float]]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(12):
        blocks = ids(0, int(rng.integers(5, 20)))
        reqs = []
        for _t in range(int(rng.integers(2, 6))):
            reqs.append((list(blocks), len(blocks) * BT + 5, int(rng.integers(1, 600)),
                         float(rng.exponential(3.0))))
            top = blocks[-1]
            blocks = blocks + ids(top + 1, top + 1 + int(rng.integers(1, 6)))
        out.append(reqs)
    return out


@pytest.mark.parametrize("system", ["flatcake", "flatcake-1q", "tiered", "tiered-wait",
                                    "tiered-timeout", "tiered-uring", "tiered-direct",
                                    "memory-only"])
def test_same_seed_same_numbers(system: str) -> None:
    wl = from_sessions(_sessions(1), BT)
    preset = tiny_preset(workers=2, gpu_blocks=80, host_blocks=30, staging_blocks=15)
    a = run_replay(wl, system, 0.8, preset, seed=7).to_dict()
    b = run_replay(wl, system, 0.8, preset, seed=7).to_dict()
    c = run_replay(wl, system, 0.8, preset, seed=8).to_dict()
    for d in (a, b, c):
        d.pop("wall_s")
        d.pop("cpu_s")
        d.pop("seed")
    assert a == b
    assert a["ttft_mean_s"] != c["ttft_mean_s"]  # another seed, other arrival times
    assert a["hit_rate_gpu"] <= a["max_hit_rate"] + 1e-12
    assert not math.isnan(a["hit_rate_gpu"])


@pytest.mark.parametrize("system", ["flatcake", "tiered-wait", "tiered-direct"])
def test_every_system_pays_the_fixed_restore_cost(system: str) -> None:
    wl = from_requests(TWO_RESTORES[:4], BT)
    preset = tiny_preset(gpu_blocks=14, host_blocks=10)
    slow = dataclasses.replace(preset, node=dataclasses.replace(preset.node,
                                                                restore_overhead_s=0.05))
    _, fast_node = replay_node(wl, system, 1.0, preset)
    _, slow_node = replay_node(wl, system, 1.0, slow)
    assert len(fast_node.rec.prefetch_s) == len(slow_node.rec.prefetch_s) == 1
    assert slow_node.rec.prefetch_s[0] - fast_node.rec.prefetch_s[0] == pytest.approx(0.05)


def test_a_restore_that_fills_memory_copies_ends_one_layer_copy_later() -> None:
    """copy_on_restore: A's second turn reads A's first turn from SSD and copies it to
    host memory layer by layer as it lands (device to host, at the link's bandwidth,
    faster than the SSD here), so the restore ends one layer's copy later; the copy is
    kept."""
    wl = from_requests(TWO_RESTORES[:4], BT)
    base = tiny_preset(gpu_blocks=14, host_blocks=10)
    got = {}
    for on in (False, True):
        placement = dataclasses.replace(base.flatcake.placement, memory_copy_watermark=1.0,
                                        copy_on_restore=on)
        preset = dataclasses.replace(base, flatcake=dataclasses.replace(
            base.flatcake, placement=placement))
        m, node = replay_node(wl, "flatcake", 1.0, preset)
        assert node.rec.hit_blocks[3] == 10 and m.read_commands > 0
        got[on] = (node.rec.prefetch_s[0], m.extra["memory_copies_made"])
    copy_s = 10 * BLOCK_BYTES / base.node.host_to_gpu_bytes_per_s
    assert got[True][0] - got[False][0] == pytest.approx(copy_s / GEOMETRY.num_layers)
    assert got[True][1] == got[False][1] + 1


def test_a_copy_slower_than_the_reads_sets_the_restores_pace() -> None:
    from flatcake.replay.systems.keys import refill_wait_s
    assert refill_wait_s(2.0, 1.0, 4) == pytest.approx(0.25)  # one layer's copy
    assert refill_wait_s(1.0, 2.0, 4) == pytest.approx(0.5 + 3 * 1.0 / 4)
