"""The store drives the request protocol as the connector does: a load whose prefix
continues into a turn another thread is still writing waits for that write to be
durable and then restores it, instead of missing it; a second store of blocks being
written writes nothing twice."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from flatcake.cio.executor import Executor
from flatcake.store import FlatCakeStore, TurnSignals
from tests.store.helpers import SMALL, TO_SSD, empty_kv, random_kv, small_config

N = 6


def _keys(n: int) -> list[bytes]:
    from flatcake.control.keys import chain_block_keys

    return chain_block_keys(list(range(n * SMALL.tokens_per_block)), SMALL.tokens_per_block,
                            "small")


def test_a_load_waits_for_the_store_in_flight_of_its_next_blocks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = random_kv(SMALL, 16)
    keys = _keys(N)
    entered, release = threading.Event(), threading.Event()
    real_write = Executor.write

    def gated_write(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        entered.set()
        assert release.wait(30)
        return real_write(self, *args, **kwargs)

    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert store.store_turn("s", keys[:2], src, range(N), TO_SSD).num_blocks == 2
        monkeypatch.setattr(Executor, "write", gated_write)
        writer = threading.Thread(target=store.store_turn, args=(
            "s", keys, src, range(N), TurnSignals(turn_index=1, context_tokens=10**6)))
        writer.start()
        assert entered.wait(30)  # blocks 2..6 allocated, their write held
        # A second store of the same blocks plans nothing: they are being written.
        again = store.store_turn("t", keys, src, range(N), TO_SSD)
        assert again.num_blocks == 0 and again.error == ""
        dst = empty_kv(SMALL, 16)
        loaded: list[int] = []
        reader = threading.Thread(target=lambda: loaded.append(
            store.load(keys, dst, range(N)).num_blocks))
        reader.start()
        reader.join(0.5)
        assert reader.is_alive() and not loaded  # waiting, not missing blocks 2..6
        release.set()
        writer.join(30)
        reader.join(30)
        assert loaded == [N]
        for layer in range(SMALL.num_layers):  # bytes equal (random bytes hold NaNs)
            got, want = dst[layer][:, :N], src[layer][:, :N]
            assert got.contiguous().view(torch.uint8).equal(want.contiguous().view(torch.uint8))
        store.control.check_integrity()
