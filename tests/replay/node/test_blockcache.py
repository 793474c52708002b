"""BlockLru: leaf-first LRU order, pins, stale entries, compaction, runs helpers."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from flatcake.replay.node.blockcache import BlockLru
from flatcake.replay.workload.runs import expand, runs_of, slice_runs


def test_eviction_is_least_recent_first_and_leaf_first_within_a_touch() -> None:
    lru = BlockLru(100, capacity_blocks=10)
    lru.touch(((0, 4),))  # request A: blocks 0..3
    lru.touch(((10, 13),))  # request B: blocks 10..12
    # A is older: its blocks go first, last block first (a radix tree's leaf).
    assert lru.evict(2).tolist() == [3, 2]
    assert lru.evict(3).tolist() == [1, 0, 12]
    assert lru.size == 2
    lru.check()


def test_a_later_touch_makes_the_old_entry_stale() -> None:
    lru = BlockLru(100, capacity_blocks=10)
    lru.touch(((0, 3),))
    lru.touch(((20, 22),))
    lru.touch(((0, 3),))  # A again: now the most recent
    assert lru.evict(2).tolist() == [21, 20]
    assert lru.evict(10).tolist() == [2, 1, 0]
    lru.check()


def test_pinned_blocks_never_leave_and_come_back_on_unpin() -> None:
    lru = BlockLru(100, capacity_blocks=10)
    lru.touch(((0, 3),))
    lru.pin(((0, 3),))
    lru.touch(((5, 7),))
    assert lru.evict(10).tolist() == [6, 5]
    assert lru.size == 3
    lru.unpin(((0, 3),))
    assert lru.evict(10).tolist() == [2, 1, 0]
    lru.check()


def test_prefix_hits_and_count_over_runs() -> None:
    lru = BlockLru(100, capacity_blocks=50)
    lru.touch(((0, 5), (10, 12)))
    runs = ((0, 5), (10, 15))
    assert lru.prefix_hits(runs) == 7
    assert lru.prefix_hits(runs, start=3) == 4
    assert lru.prefix_hits(runs, start=7) == 0
    assert lru.count_present(runs) == 7
    lru.remove(((3, 4),))
    assert lru.prefix_hits(runs) == 3
    assert lru.size == 6


def test_runs_helpers() -> None:
    ids = np.array([4, 5, 6, 9, 10, 2], dtype=np.int32)
    runs = runs_of(ids)
    assert runs == ((4, 7), (9, 11), (2, 3))
    assert expand(runs).tolist() == ids.tolist()
    assert slice_runs(runs, 2, 5) == ((6, 7), (9, 11))
    assert slice_runs(runs, 5, 5) == ()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(1, 12), st.booleans()),
                min_size=1, max_size=40),
       st.integers(5, 40))
def test_matches_a_reference_lru(ops: list[tuple[int, int, bool]], cap: int) -> None:
    """Against a dict-based LRU with the same leaf-first tie rule."""
    lru = BlockLru(80, capacity_blocks=cap)
    ref: dict[int, tuple[int, int]] = {}  # id -> (tick, -position)
    for tick, (start, n, evict) in enumerate(ops, start=1):
        ids = list(range(start, min(start + n, 80)))
        lru.touch(((ids[0], ids[-1] + 1),))
        for pos, i in enumerate(ids):
            ref[i] = (tick, -pos)
        over = lru.size - lru.capacity_blocks
        if evict and over > 0:
            got = lru.evict(over).tolist()
            want = sorted(ref, key=lambda i: ref[i])[:over]
            assert got == want
            for i in want:
                del ref[i]
        assert lru.size == len(ref)
        lru.check()
