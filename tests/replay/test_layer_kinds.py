"""Layers of different kinds in the replay: per-kind bytes and commands by hand, entries
spanning two trace blocks, and the paper preset folded or not."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from flatcake.config import apply_setting
from flatcake.geometry import KVGeometry
from flatcake.replay.presets import get_preset
from flatcake.replay.simulate import replay_blocks, replay_node, run_replay
from flatcake.replay.workload.recut import recut
from flatcake.replay.workload.source import load_workload
from flatcake.replay.workload.trace import from_requests, from_sessions
from tests.replay.helpers import ids, tiny_preset
from tests.replay.layer_scenarios import BRANCH, HYBRID, REQS, TRACE_BT


def _replay(system: str, reqs: list[Any] = REQS, uncached: tuple[str, ...] = ()
            ) -> tuple[np.ndarray, dict[str, object], int]:
    wl = from_requests(reqs, TRACE_BT)
    # Budgets in blocks of all layers (17,384 B): 4 -> 7 blocks of 9,192 B, 3 -> 5.
    preset = tiny_preset(gpu_blocks=4, host_blocks=3, geometry=HYBRID)
    preset = preset.with_node(uncached_kinds=uncached)
    m, node = replay_node(wl, system, 1 / 2.5, preset)
    return node.rec.hit_blocks.copy(), m.extra, m.read_commands


def test_recut_pairs_trace_blocks_and_drops_a_partial_entry() -> None:
    wl = recut(from_requests(REQS, TRACE_BT), 2)
    assert wl.block_tokens == 32
    assert [len(wl.blocks(i)) for i in range(5)] == [5, 5, 5, 6, 6]
    # A's five blocks begin the extended A; distinct trace blocks give distinct blocks.
    assert wl.blocks(3)[:5].tolist() == wl.blocks(0).tolist()
    assert len({*wl.blocks(0).tolist(), *wl.blocks(1).tolist(), *wl.blocks(2).tolist()}) == 15
    with pytest.raises(ValueError, match="positive int"):
        recut(wl, 0)


def test_the_replay_block_holds_whole_entries() -> None:
    wl, g = replay_blocks(from_requests(REQS, TRACE_BT), tiny_preset(geometry=HYBRID))
    assert (wl.block_tokens, g.tokens_per_block) == (32, 32)
    assert g.layer_block_bytes == (8192, 4096, 4096, 1000)
    assert g.history_block_bytes == 9192


def test_flatcake_counts_bytes_and_commands_per_kind() -> None:
    hits, extra, commands = _replay("flatcake")
    # The extended A and B hit their 5 whole blocks; their 11th trace block, half an
    # entry, is recomputed.
    assert hits[3:].tolist() == [5, 5]
    # A, B and C are first turns: SSD segments of 5 blocks. The sliding layer keeps its
    # last block; the others every block. The extended turns go to memory (short reply).
    assert extra["ssd_written_bytes_by_kind"] == {"sliding": 3 * 8192,
                                                  "full": 3 * 5 * 2 * 4096,
                                                  "c32": 3 * 5 * 1000}
    assert extra["ssd_saved_by_windows_bytes"] == 3 * 4 * 8192
    assert extra["ssd_not_stored_bytes"] == 0
    # Each restore reads one segment: one command per layer.
    assert extra["restore_commands_by_kind"] == {"sliding": 1.0, "full": 2.0, "c32": 1.0}
    assert commands == 2 * 4


def test_a_kind_the_engine_does_not_prefix_cache_is_never_stored() -> None:
    hits, extra, commands = _replay("flatcake", uncached=("sliding",))
    assert hits[3:].tolist() == [5, 5]
    # As the vLLM connector: nothing of the sliding layer is written or read; what it
    # would have taken (every block of it) is counted as not stored, not as saved.
    assert extra["ssd_written_bytes_by_kind"] == {"sliding": 0,
                                                  "full": 3 * 5 * 2 * 4096,
                                                  "c32": 3 * 5 * 1000}
    assert extra["ssd_saved_by_windows_bytes"] == 0
    assert extra["ssd_not_stored_bytes"] == 3 * 5 * 8192
    assert extra["restore_commands_by_kind"] == {"sliding": 0.0, "full": 2.0, "c32": 1.0}
    assert commands == 2 * 3
    assert extra["ssd_window_bytes_released"] == 0




@pytest.mark.parametrize(("uncached", "hit"), [((), 0), (("sliding",), 3)])
def test_only_a_prefix_cached_window_cuts_a_hit_back(uncached: tuple[str, ...],
                                                      hit: int) -> None:
    hits, _extra, _commands = _replay("flatcake", BRANCH, uncached)
    # A window the store keeps (the engine prefix-caches it) is not held at D's block 3:
    # the hit is cut back to nothing. A window the engine rebuilds cuts nothing back.
    assert hits[3] == hit


# Per block, tiered-direct reads full 2 x 4,096 B and c32 1,000 -> 4,096 B (O_DIRECT),
# and the sliding layer's 8,192 B for the window's 1 block at the hit's end when the
# engine prefix-caches it. A block of every layer is 17,384 B (an object of 20,480 B);
# of the layers that keep every block, 9,192 B (12,288 B). The host tier (3 blocks of
# 17,384 B) then holds 3 blocks or 5; the 17 blocks of the 5 turns demote the rest.
@pytest.mark.parametrize(("uncached", "sliding_cmds", "window_bytes", "demoted", "obj"),
                         [((), 1, 8192, 14, 20480), (("sliding",), 0, 0, 12, 12288)])
def test_tiered_direct_stores_and_reads_a_prefix_cached_window(
        uncached: tuple[str, ...], sliding_cmds: int, window_bytes: int, demoted: int,
        obj: int) -> None:
    preset = tiny_preset(gpu_blocks=4, host_blocks=3, geometry=HYBRID)
    m, node = replay_node(from_requests(REQS, TRACE_BT), "tiered-direct", 1 / 2.5,
                          preset.with_node(uncached_kinds=uncached))
    assert node.rec.hit_blocks[3:].tolist() == [5, 5]
    # One command per block per layer, and per window block per windowed layer.
    assert m.extra["restore_commands_by_kind"] == {"sliding": float(sliding_cmds),
                                                   "full": 10.0, "c32": 5.0}
    assert m.read_commands == 2 * (5 * 3 + sliding_cmds)
    assert m.ssd_read_bytes == 2 * (5 * (2 * 4096 + 4096) + window_bytes)
    # Every block's object holds its windowed layers (vLLM stores every sliding block).
    assert m.extra["blocks_demoted"] == demoted
    assert m.ssd_write_bytes == m.extra["ssd_used_bytes"] == demoted * obj


def test_a_baseline_hit_ending_inside_a_turn_keeps_its_window() -> None:
    # D's hit ends inside A: A's every block holds its sliding state, so, unlike
    # FlatCake's segments (the window at a turn's end only), nothing is cut back.
    preset = tiny_preset(gpu_blocks=4, host_blocks=3, geometry=HYBRID)
    _m, node = replay_node(from_requests(BRANCH, TRACE_BT), "tiered-direct", 1 / 2.5, preset)
    assert node.rec.hit_blocks[3] == 3


# The paper preset's geometry before its layer kinds were kept: 22 alike layers of 179 B
# per token (the 20 c128a layers folded into one more c4a-sized layer, no windows).
FOLDED = KVGeometry(num_layers=22, tokens_per_block=128, mla_latent_dim=179, dtype="uint8",
                    name="folded")


def test_folded_and_unfolded_paper_differ_only_by_the_geometry() -> None:
    # 128-token trace blocks: both geometries replay the same blocks.
    wl = load_workload(None, sessions=6, block_tokens=128, kind="agent")[0]
    # Window rows at turn ends only: a turn written at a branch writes the window's
    # blocks before it again (store.window_rows), which the folded geometry has not.
    paper = get_preset("paper")
    paper = dataclasses.replace(paper, flatcake=apply_setting(
        paper.flatcake, "store", "window_rows", "turn-ends"))
    unfolded = run_replay(wl, "flatcake", 0.5, paper)
    folded = run_replay(wl, "flatcake", 0.5, dataclasses.replace(paper, geometry=FOLDED))
    assert unfolded.hit_rate_gpu == folded.hit_rate_gpu
    assert unfolded.max_hit_rate == folded.max_hit_rate
    written, base = (unfolded.extra["ssd_written_bytes_by_kind"],
                     folded.extra["ssd_written_bytes_by_kind"])
    assert isinstance(written, dict) and isinstance(base, dict)
    blocks = base["full"] // (22 * 179 * 128)
    assert blocks > 0
    # Every block of the layers that keep their history: 32 c4a entries and indexer
    # keys, one c128a entry.
    assert written["c4a"] == blocks * 21 * 585 * 32
    assert written["c4a-indexer"] == blocks * 21 * 135 * 32
    assert written["c128a"] == blocks * 20 * 864
    # vLLM does not prefix-cache DeepSeek-V4's sliding windows under bounded replay:
    # FlatCake stores none. It does prefix-cache the compressor state: its windows are
    # stored, at most one block per segment.
    assert written["sliding"] == 0
    assert unfolded.extra["ssd_not_stored_bytes"] == blocks * 43 * 585 * 128
    for kind, size in (("c4a-state", 21 * 8 * 8208), ("c4a-indexer-state", 21 * 8 * 2160),
                       ("c128a-state", 20 * 128 * 4104)):
        assert 0 < written[kind] < blocks * size
    assert unfolded.extra["ssd_saved_by_windows_bytes"] > 0
    assert folded.extra["ssd_saved_by_windows_bytes"] == 0


def test_a_session_workload_recut_keeps_its_sessions() -> None:
    sess = [[(ids(0, 3), 48, 5, 0.0), (ids(0, 6), 96, 5, 1.0)]]
    wl = recut(from_sessions(sess, TRACE_BT), 2)
    assert [len(wl.blocks(i)) for i in range(2)] == [1, 3]
    assert wl.session.tolist() == [0, 0] and wl.num_sessions == 1


def test_flatcake_counts_the_window_it_restores_as_delivered() -> None:
    wl = from_requests(REQS, TRACE_BT)
    preset = tiny_preset(gpu_blocks=4, host_blocks=3, geometry=HYBRID)
    m, node = replay_node(wl, "flatcake", 1 / 2.5, preset)
    # Two restores of one 5-block segment: the sliding layer's last block (8,192 B), two
    # full layers (5 x 4,096 B each) and the c32 layer (5 x 1,000 B, read as 8,192 B).
    # The engine uses the window too: delivered is 54,152 B, not the 45,960 B of the
    # layers that keep every block.
    assert node.rec.ssd_read_bytes == 2 * (8192 + 2 * 5 * 4096 + 8192)
    assert node.rec.ssd_useful_bytes == 2 * (8192 + 2 * 5 * 4096 + 5 * 1000)
    assert m.read_amplification == pytest.approx(57344 / 54152)


@pytest.mark.parametrize("at_once", [False, True])
def test_flatcake_releases_older_windows_and_restores_the_newest_only(at_once: bool) -> None:
    # Two sessions of three turns (10, 15, 20 blocks), each turn on SSD; the GPU holds
    # one session, so the other's next turn restores from SSD.
    def turns() -> list[tuple[list[int], int, int, float]]:
        return [(ids(0, 20), 20 * TRACE_BT, 600, 0.0), (ids(0, 30), 30 * TRACE_BT, 600, 30.0),
                (ids(0, 40), 40 * TRACE_BT, 600, 30.0)]
    preset = tiny_preset(gpu_blocks=25, host_blocks=3, geometry=HYBRID)
    store = dataclasses.replace(preset.flatcake.store, release_windows_at_once=at_once)
    preset = dataclasses.replace(preset, flatcake=dataclasses.replace(preset.flatcake,
                                                                      store=store))
    m, node = replay_node(from_sessions([turns(), turns()], TRACE_BT), "flatcake", 1.0,
                          preset)
    assert node.rec.hit_blocks.tolist() == [0, 10, 15] * 2
    # As the store: once a turn is durable, each older turn's sliding row (8,192 B) is
    # superseded, four in all: kept while the SSD has room (a hit may end there),
    # released at once with ``release_windows_at_once``. Either way a restore reads the
    # newest turn's window only (one command of the sliding layer each).
    assert m.extra["ssd_window_bytes_released"] == (4 * 8192 if at_once else 0)
    assert m.extra["restore_commands_by_kind"]["sliding"] == 1.0
    assert node.rec.ssd_read_bytes == 212992
