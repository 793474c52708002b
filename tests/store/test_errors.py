"""Bad input raises ValueError (or KeyError for unknown sessions) naming the field and
the value, before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flatcake.geometry import KVGeometry
from flatcake.store import FlatCakeStore, TurnSignals
from tests.store.helpers import SMALL, TO_SSD, empty_kv, random_kv, session_keys, small_config


@pytest.fixture
def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as s:
        yield s


KEYS = session_keys(1, 4)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"keys": [*KEYS[:3], b"short"]}, r"keys\[3\]"),
        ({"keys": b"x" * 32}, "keys must be a sequence"),
        ({"block_ids": [0, 1, 2]}, "block_ids has 3 entries for 4 keys"),
        ({"block_ids": [0, 1, 2, 99]}, "block_ids contains 99"),
        ({"block_ids": [0, 1, 2.5, 3]}, "block_ids must hold integers"),
        ({"kv_caches": random_kv(SMALL, 8)[:2]}, "kv_caches has 2 layers"),
        ({"kv_caches": [t.float() for t in random_kv(SMALL, 8)]}, "block_bytes_per_layer"),
        ({"kv_caches": [torch.zeros(8, 3) for _ in range(3)]}, "block_bytes_per_layer=256"),
        ({"session_id": ""}, "session_id"),
        ({"session_id": 7}, "session_id"),
        ({"signals": {"turn_index": 0}}, "signals must be a TurnSignals"),
        ({"signals": TurnSignals(turn_index=-1, context_tokens=0)}, "turn_index"),
        ({"signals": TurnSignals(turn_index=1, context_tokens=0, shared_refcount=-2)},
         "shared_refcount"),
    ],
)
def test_store_turn_rejects(store: FlatCakeStore, kwargs: dict[str, object],
                            needle: str) -> None:
    args: dict[str, object] = {"session_id": "s", "keys": KEYS,
                               "kv_caches": random_kv(SMALL, 8), "block_ids": [0, 1, 2, 3],
                               "signals": TO_SSD}
    args.update(kwargs)
    with pytest.raises(ValueError, match=needle):
        store.store_turn(**args)  # type: ignore[arg-type]
    assert store.inspect()["media"]["ssd"]["used_bytes"] == 0  # nothing was allocated


def test_load_rejects_repeated_slots(store: FlatCakeStore) -> None:
    store.store_turn("s", KEYS, random_kv(SMALL, 8), range(4), TO_SSD)
    with pytest.raises(ValueError, match="repeats"):
        store.load(KEYS, empty_kv(SMALL, 8), [0, 1, 1, 2])


def test_unknown_session_named(store: FlatCakeStore) -> None:
    with pytest.raises(KeyError, match="no-such-session"):
        store.drop_session("no-such-session")


def test_closed_store_refuses(tmp_path: Path) -> None:
    store = FlatCakeStore.open(tmp_path, SMALL, small_config())
    store.close()
    store.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        store.lookup(KEYS)


def test_one_store_per_root(tmp_path: Path) -> None:
    with FlatCakeStore.open(tmp_path, SMALL, small_config()), \
            pytest.raises(ValueError, match="already open"):
        FlatCakeStore.open(tmp_path, SMALL, small_config())
    FlatCakeStore.open(tmp_path, SMALL, small_config()).close()  # released on close


def test_open_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="gpt-9"):
        FlatCakeStore.open(tmp_path, "gpt-9")
    with pytest.raises(ValueError, match="geometry must be"):
        FlatCakeStore.open(tmp_path, 42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="config must be"):
        FlatCakeStore.open(tmp_path, SMALL, {"store": {}})  # type: ignore[arg-type]


def test_reopen_with_another_geometry_or_span_is_refused(tmp_path: Path) -> None:
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        store.store_turn("s", KEYS, random_kv(SMALL, 8), range(4), TO_SSD)
    other = KVGeometry(num_layers=3, tokens_per_block=8, num_kv_heads=2, head_dim=8,
                       dtype="float16", name="other")
    with pytest.raises(ValueError, match="geometry 'other'"):
        FlatCakeStore.open(tmp_path, other, small_config())
    with pytest.raises(ValueError, match=r"store\.session_file_bytes"):
        FlatCakeStore.open(tmp_path, SMALL, small_config("store.session_file_bytes=8388608"))
    # The failed opens released the root.
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert store.lookup(KEYS).num_blocks == 4
