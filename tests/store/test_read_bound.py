"""The read-command bound, measured from the reader's real preadv calls: a history of
T SSD turns restores in at most layers x T commands (one batch: exactly layers), never
layers x blocks; memory turns add arena copies, not SSD commands. And
``store.reads_in_flight``: how many of those commands one restore has running at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from flatcake.cio.readers import DirectReader, ReadRequest
from flatcake.geometry import KVGeometry
from flatcake.store import FlatCakeStore, TurnSignals
from tests.store.helpers import TO_MEMORY, empty_kv, random_kv, session_keys, small_config

# 64 KiB per block per layer (Llama-3.1-8B's block size): a layer of one segment is far
# apart from the next layer, so nothing merges across layers.
G = KVGeometry(num_layers=4, tokens_per_block=16, num_kv_heads=8, head_dim=128,
               dtype="bfloat16", name="llama-8b-4-layers")
CONFIG = small_config("store.session_file_bytes=67108864")


def _restore(store: FlatCakeStore, keys: list[bytes], slots: int) -> tuple[int, object]:
    before = store.reader.stats().commands
    res = store.load(keys, empty_kv(G, slots), range(len(keys)))
    return store.reader.stats().commands - before, res


def test_one_batch_restores_in_layers_commands(tmp_path: Path) -> None:
    keys = session_keys(1, 12, G)
    with FlatCakeStore.open(tmp_path, G, CONFIG) as store:
        store.store_turn("s", keys, random_kv(G, 12), range(12), TurnSignals(0, 192))
        measured, res = _restore(store, keys, 12)
    assert measured == res.commands == G.num_layers  # 12 blocks, 4 layers: 4 reads
    assert res.num_blocks == 12


@pytest.mark.parametrize("turn_blocks", [[3, 1, 4, 2], [1, 1, 1, 1, 1, 1]])
def test_appended_turns_restore_in_at_most_layers_x_turns(tmp_path: Path,
                                                          turn_blocks: list[int]) -> None:
    total = sum(turn_blocks)
    keys = session_keys(2, total, G)
    src = random_kv(G, total)
    with FlatCakeStore.open(tmp_path, G, CONFIG) as store:
        done = 0
        for turn, n in enumerate(turn_blocks):
            done += n
            store.store_turn("s", keys[:done], src, range(done),
                             TurnSignals(turn, done * 16, prev_reply_tokens=4096))
        measured, res = _restore(store, keys, total)
    turns = len(turn_blocks)
    assert res.num_ssd_blocks == total
    assert measured == res.commands
    assert G.num_layers <= measured <= G.num_layers * turns
    if total > turns:
        assert measured < G.num_layers * total  # never one command per block


def test_memory_turns_are_copies_not_commands(tmp_path: Path) -> None:
    keys = session_keys(3, 10, G)
    src = random_kv(G, 10)
    with FlatCakeStore.open(tmp_path, G, CONFIG) as store:
        store.store_turn("s", keys[:4], src, range(4), TurnSignals(0, 64))
        store.store_turn("s", keys[:7], src, range(7), TO_MEMORY)
        store.store_turn("s", keys[:10], src, range(10), TO_MEMORY)
        measured, res = _restore(store, keys, 10)
    assert (res.num_ssd_blocks, res.num_memory_blocks) == (4, 6)
    assert measured == res.commands == G.num_layers  # one SSD turn
    # Two memory turns, adjacent in the arena: at most one copy per turn and layer.
    assert G.num_layers <= res.memory_copies <= 2 * G.num_layers


@pytest.mark.parametrize(("reads_in_flight", "low", "high"), [(1, 1, 1), (2, 2, 2), (8, 3, 4)])
def test_reads_in_flight_bounds_the_preadv_calls_of_a_restore(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reads_in_flight: int, low: int,
        high: int) -> None:
    # 6 turns, no read-through: 6 commands per layer, 24 in all, each held >= 20 ms in
    # preadv. The store's reader has 4 threads; the config bounds one restore.
    active, peak = 0, 0
    lock = threading.Lock()
    real_read = DirectReader._read

    def slow_read(self: DirectReader, request: ReadRequest, view: memoryview) -> int:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        try:
            time.sleep(0.02)
            return real_read(self, request, view)
        finally:
            with lock:
                active -= 1

    monkeypatch.setattr(DirectReader, "_read", slow_read)
    cfg = small_config("store.session_file_bytes=67108864", "store.read_threads=4",
                       "planner.gap_limit_bytes=0", f"store.reads_in_flight={reads_in_flight}")
    keys = session_keys(4, 6, G)
    src = random_kv(G, 6)
    with FlatCakeStore.open(tmp_path, G, cfg) as store:
        for turn in range(6):
            store.store_turn("s", keys[:turn + 1], src, range(turn + 1),
                             TurnSignals(turn, (turn + 1) * 16, prev_reply_tokens=4096))
        measured, res = _restore(store, keys, 6)
    assert res.num_blocks == 6  # type: ignore[attr-defined]
    assert measured == G.num_layers * 6
    assert low <= peak <= high  # the bound holds; with 8, the 4 threads are the limit
