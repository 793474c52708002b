"""Control-plane cost: the request shape and the lookup + plan of a big session."""

from __future__ import annotations

import pytest

from flatcake.bench.control_cost import control_plane_at_scale, session_keys, split_turns
from flatcake.geometry import preset


def test_split_turns_covers_every_block_once() -> None:
    turns = split_turns(10, 3)
    assert [list(t) for t in turns] == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    assert split_turns(5, 5) == [range(i, i + 1) for i in range(5)]


@pytest.mark.parametrize(("blocks", "turns"), [(3, 0), (3, 4)])
def test_split_turns_rejects_impossible_splits(blocks: int, turns: int) -> None:
    with pytest.raises(ValueError, match="num_turns"):
        split_turns(blocks, turns)


def test_session_keys_are_chained_and_deterministic() -> None:
    g = preset("llama-3.1-8b")
    a = session_keys(g, 20, seed=1)
    assert a == session_keys(g, 20, seed=1)
    assert len(set(a)) == 20 and all(len(k) == 32 for k in a)
    assert a != session_keys(g, 20, seed=2)


def test_big_session_plans_at_most_layers_times_turns_reads_per_64mib() -> None:
    g = preset("llama-3.1-8b")
    ms, blocks, commands = control_plane_at_scale(g, 219_000, 8, repeats=2)
    assert blocks == 219_000 // 16
    # Each turn of a layer is one merged range of ~107 MiB, split at 64 MiB into 2.
    assert commands == g.num_layers * 8 * 2
    assert ms > 0
