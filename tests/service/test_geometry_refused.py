"""An attach whose model geometry the root's files were not written with is refused by
name, and leaves the node service and its root as they were: the right model attaches
next and loads its bytes back (it was left "already open in another store")."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from flatcake.store import FlatCakeStore
from tests.service.helpers import Service
from tests.store.helpers import (
    SMALL,
    TO_SSD,
    block_bytes,
    empty_kv,
    random_kv,
    session_keys,
    small_config,
)

SLOTS = 8


def test_a_geometry_refused_at_attach_leaves_the_root_to_the_right_model(tmp_path: Path
                                                                         ) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock").start()
    cfg = small_config(f"store.node=unix:{svc.sock}", "store.node_timeout_s=5")
    kv, keys, slots = random_kv(SMALL, SLOTS, seed=7), session_keys(1, 4), list(range(4))
    try:
        store = FlatCakeStore.open(svc.root, SMALL, cfg)
        assert store.store_turn("s1", keys, kv, slots, TO_SSD).num_blocks == 4
        store.close()
    finally:
        assert svc.stop() == 0, svc.stderr()
    svc.start()  # books are made at the first attach: the wrong model's
    try:
        wrong = dataclasses.replace(SMALL, head_dim=16, name="wrong")
        with pytest.raises(ValueError, match=r"holds 3 layers x 256 B blocks, but geometry "
                                             r"'wrong' has 3 layers x 512 B"):
            FlatCakeStore.open(svc.root, wrong, cfg)
        with pytest.raises(ValueError, match="already open"):  # the service kept the root
            FlatCakeStore.open(svc.root, SMALL, small_config())
        store = FlatCakeStore.open(svc.root, SMALL, cfg)
        try:
            got = empty_kv(SMALL, SLOTS)
            assert store.load(keys, got, slots).num_blocks == 4
            for layer in range(SMALL.num_layers):
                for s in slots:
                    assert block_bytes(got, layer, s, "kv_blocks") == \
                        block_bytes(kv, layer, s, "kv_blocks")
        finally:
            store.close()
    finally:
        assert svc.stop() == 0, svc.stderr()
