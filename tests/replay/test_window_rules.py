"""Each baseline stores a prefix-cached sliding window by the rule of the engine it
models (``layers.PeerBlocks``): SGLang's trailing window per request, cut-back
included, for the HiCache baselines; vLLM's every block for ``tiered-direct``."""

from __future__ import annotations

import numpy as np
import pytest

from flatcake.replay.cluster import ClusterSpec, replay_cluster
from flatcake.replay.simulate import replay_node
from flatcake.replay.systems.settings import TieredConfig
from flatcake.replay.systems.windows import TrailingWindows
from flatcake.replay.workload.trace import from_requests, from_sessions
from tests.replay.helpers import ids, tiny_preset
from tests.replay.layer_scenarios import BRANCH, HYBRID, REQS, TRACE_BT


def test_trailing_windows_mark_and_cut() -> None:
    wins = TrailingWindows(10, 2)
    wins.mark(((0, 3), (7, 9)), 5)  # positions 0..4: ids 0, 1, 2, 7, 8
    assert np.flatnonzero(wins.held).tolist() == [7, 8]
    runs = ((0, 3), (7, 9))
    assert wins.cut(runs, 0, 5) == 5
    # Ending at position 4 needs ids 2 and 7: 2 holds none, and no shorter end works.
    assert wins.cut(runs, 0, 4) == 0
    # Blocks before ``start`` are on the GPU: ending at 4 then needs id 7 only.
    assert wins.cut(runs, 3, 4) == 4
    wins.drop(np.array([8], dtype=np.int32))
    assert wins.cut(runs, 0, 5) == 0
    assert wins.count(np.array([7, 8], dtype=np.int32)) == 1
    off = TrailingWindows(10, 0)
    off.mark(runs, 5)
    assert off.cut(runs, 0, 4) == 4 and off.count(np.arange(10)) == 0


def test_an_unknown_window_rule_is_refused() -> None:
    with pytest.raises(ValueError, match="window_rule='lmcache'"):
        TieredConfig(window_rule="lmcache")


def _run(system: str, reqs: list, uncached: tuple[str, ...] = (), host_blocks: int = 3):
    preset = tiny_preset(gpu_blocks=4, host_blocks=host_blocks, geometry=HYBRID)
    return replay_node(from_requests(reqs, TRACE_BT), system, 1 / 2.5,
                       preset.with_node(uncached_kinds=uncached))


# D's hit ends at A's third block, inside A: SGLang backed up A's window at A's end
# only, so the hit is cut back to nothing; vLLM's every-block rule (tiered-direct) and a
# window the engine does not prefix-cache keep the 3 blocks.
@pytest.mark.parametrize(("system", "host_blocks"), [("tiered-wait", 3), ("memory-only", 100)])
@pytest.mark.parametrize(("uncached", "hit"), [((), 0), (("sliding",), 3)])
def test_sglang_cuts_a_hit_back_to_a_held_trailing_window(
        system: str, host_blocks: int, uncached: tuple[str, ...], hit: int) -> None:
    _m, node = _run(system, BRANCH, uncached, host_blocks)
    assert node.rec.hit_blocks[3] == hit


def test_vllm_keeps_every_window_block() -> None:
    _m, node = _run("tiered-direct", BRANCH)
    assert node.rec.hit_blocks[3] == 3


def test_sglang_stores_one_window_per_request_and_reads_the_hits_end() -> None:
    # Objects of the layers that keep every block: 9,192 B -> 12,288 B (O_DIRECT);
    # a window object: the sliding layer's 8,192 B. A, B and C each back up their last
    # block's window; the host tier (4 blocks of 9,192 B, the window pages its blocks
    # hold included) demotes 11 blocks, carrying those 3.
    m, _node = _run("tiered-wait", BRANCH, host_blocks=4)
    assert m.extra["blocks_demoted"] == 11
    assert m.ssd_write_bytes == m.extra["ssd_used_bytes"] == 11 * 12288 + 3 * 8192
    # The extended A hits its 5 blocks from SSD: 5 objects and the window at its end.
    m, node = _run("tiered-wait", REQS, host_blocks=4)
    assert node.rec.hit_blocks[3] == 5
    assert m.ssd_read_bytes == 5 * 12288 + 8192
    assert m.read_commands == 5 + 1


@pytest.mark.parametrize(("uncached", "window"), [((), 8192), (("sliding",), 0)])
def test_a_cluster_read_brings_the_window_at_the_hits_end(uncached: tuple[str, ...],
                                                          window: int) -> None:
    # Turn 0 (10 blocks of 32 tokens) runs on node 0, turn 1 on node 1, which reads the
    # 10 blocks from node 0's host memory: 9,192 B each, and the sliding layer of the
    # window's one block at the hit's end when the engine prefix-caches it.
    session = [(ids(0, 20), 20 * TRACE_BT, 500, 0.0), (ids(0, 25), 25 * TRACE_BT, 10, 30.0)]
    preset = tiny_preset(gpu_blocks=80, geometry=HYBRID).with_node(uncached_kinds=uncached)
    m, cluster = replay_cluster(from_sessions([session], TRACE_BT), "tiered-direct", 1.0,
                                preset, ClusterSpec(2, "round_robin", True))
    assert list(cluster.rec.hit_blocks) == [0, 10]
    assert m.extra["remote_blocks"] == 10
    assert m.extra["remote_memory_bytes"] == 10 * 9192 + window
    assert m.extra["remote_ssd_bytes"] == 0


def test_a_cut_back_is_counted_where_the_hit_is_decided() -> None:
    m, _node = _run("memory-only", BRANCH, host_blocks=100)
    assert (m.extra["window_cut_hits"], m.extra["window_cut_blocks"]) == (1, 3)
    m, _node = _run("tiered-wait", BRANCH)
    assert (m.extra["window_cut_hits"], m.extra["window_cut_blocks"]) == (1, 3)
    m, _node = _run("memory-only", BRANCH, ("sliding",), host_blocks=100)
    assert "window_cut_blocks" not in m.extra


# Blocks of 32 tokens, as the replay's (no re-cut). A, B, C and D end on a partial block
# (176 tokens: 5 full blocks and half of one, hashed as 6 ids, as Mooncake's traces hash
# ceil(input / block)); then A comes back: its 6th block is full now (a new id) and it
# goes on. No engine caches a partial block, so every system stores A's 5 full blocks
# and keeps their window at the 5th: A's return hits all 5. Storing the partial block
# put FlatCake's window and SGLang's trailing window on it, where no hit ends (0 hit).
PARTIAL = [(0.0, ids(0, 6), 176, 2), (1.0, ids(100, 106), 176, 2),
           (2.0, ids(200, 206), 176, 2), (3.0, ids(300, 306), 176, 2),
           (10.0, ids(0, 5) + ids(50, 53), 256, 2)]


@pytest.mark.parametrize(("system", "host_blocks"), [
    ("flatcake", 3), ("tiered-wait", 4), ("tiered-direct", 3), ("memory-only", 100)])
def test_a_partial_last_block_is_not_stored_and_holds_no_window(
        system: str, host_blocks: int) -> None:
    preset = tiny_preset(gpu_blocks=10, host_blocks=host_blocks, geometry=HYBRID)
    m, node = replay_node(from_requests(PARTIAL, 32), system, 1 / 2.5, preset)
    assert node.rec.hit_blocks.tolist() == [0, 0, 0, 0, 5]
    assert m.extra.get("window_cut_hits", 0) == 0
    if system == "tiered-direct":
        # 4 requests x 5 full blocks, each its layers that keep every block (9,192 B
        # widened to 12,288 B) and its sliding block (8,192 B): no partial block.
        assert m.ssd_write_bytes == 4 * 5 * (12288 + 8192)


@pytest.mark.parametrize(("uncached", "turn_end_hits"), [((), [0, 0, 5, 0]),
                                                         (("sliding",), [0, 3, 5, 3])])
def test_the_turn_end_bound_ends_a_hit_where_an_earlier_turn_ended(
        uncached: tuple[str, ...], turn_end_hits: list[int]) -> None:
    # A: 5 full blocks. D shares A's first 3 and goes on: the every-block bound hits 3,
    # the turn-end bound none (no earlier request ended at 3). E extends A: both hit A's
    # end, 5. F shares the first 3 again: still nobody's end. A window the engine does
    # not prefix-cache cuts nothing: the two bounds are equal.
    reqs = [(0.0, ids(0, 5), 160, 2), (1.0, ids(0, 3) + ids(500, 502), 160, 2),
            (2.0, ids(0, 5) + ids(600, 601), 192, 2), (3.0, ids(0, 3) + ids(700, 702), 160, 2)]
    preset = tiny_preset(gpu_blocks=10, host_blocks=3, geometry=HYBRID)
    m, node = replay_node(from_requests(reqs, 32), "flatcake", 1 / 2.5,
                          preset.with_node(uncached_kinds=uncached))
    assert node.rec.max_hit_blocks.tolist() == [0, 3, 5, 3]
    assert node.rec.turn_end_hit_blocks.tolist() == turn_end_hits
    assert m.max_hit_rate_turn_ends == sum(turn_end_hits) / node.rec.num_blocks.sum()


@pytest.mark.parametrize(("budget_blocks", "hit", "dropped"), [(15, 0, 5), (18, 5, 1)])
def test_sglangs_window_pages_share_the_host_budget(budget_blocks: int, hit: int,
                                                    dropped: int) -> None:
    # memory-only: A, B, C put 5 full blocks each (9,192 B a block) and a trailing
    # window page each (8,192 B). With 15 blocks' bytes the blocks alone fit, the
    # windows do not: the tier drops its oldest blocks (A's) to hold them, and A's
    # return finds nothing (when windows rode free it hit all 5). With 18 blocks'
    # bytes every block and window fits, and A hits 5.
    preset = tiny_preset(gpu_blocks=4, host_blocks=3, geometry=HYBRID).with_node(
        host_memory_bytes=budget_blocks * 9192)
    m, node = replay_node(from_requests(REQS[:4], TRACE_BT), "memory-only", 1 / 2.5, preset)
    assert node.rec.hit_blocks[3] == hit
    assert m.extra["host_blocks_dropped"] == dropped
