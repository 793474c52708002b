"""The trace model: columns, per-request block views, session indexing, validation."""

from __future__ import annotations

import numpy as np
import pytest

from flatcake.traces import Trace, build_trace


def _trace(**overrides: object) -> Trace:
    kwargs: dict[str, object] = dict(
        name="t", source_format="test", block_size_tokens=4, clock="session",
        has_hashes=True, partial_last_block=False,
        # Session 1's requests come first in file order but sessions stay separate.
        time_s=[0.0, 0.0, 2.0, 5.0, 1.0],
        input_tokens=[8, 4, 12, 12, 9],
        output_tokens=[1, 2, 3, 4, 5],
        block_counts=[2, 1, 3, 3, 2],
        block_hashes=np.arange(11, dtype=np.int64),
        session=[0, 1, 0, 0, 1],
        agent=[0, 0, 0, 1, 0],
        session_names=["a", "b"],
    )
    kwargs.update(overrides)
    return build_trace(**kwargs)  # type: ignore[arg-type]


def test_blocks_are_views_of_one_flat_array() -> None:
    tr = _trace()
    assert tr.num_requests == 5 and tr.num_block_accesses == 11
    assert tr.block_offsets.tolist() == [0, 2, 3, 6, 9, 11]
    assert tr.blocks(2).tolist() == [3, 4, 5]
    assert tr.blocks(2).base is tr.block_hashes or tr.blocks(2).base is tr.block_hashes.base
    assert tr.num_blocks.tolist() == [2, 1, 3, 3, 2]
    assert tr.request_of_access().tolist() == [0, 0, 1, 2, 2, 2, 3, 3, 3, 4, 4]


def test_sessions_index_and_turns_per_agent() -> None:
    tr = _trace()
    assert tr.requests_of_session(0).tolist() == [0, 2, 3]
    assert tr.requests_of_session(1).tolist() == [1, 4]
    assert tr.session_sizes.tolist() == [3, 2]
    # Turns count per (session, agent): the sub-agent's first request is its turn 0.
    assert tr.turn.tolist() == [0, 0, 1, 0, 1]
    with pytest.raises(ValueError, match="session index 2"):
        tr.requests_of_session(2)


def test_unknown_columns_default() -> None:
    tr = _trace(session=None, session_names=[], agent=None)
    assert tr.session.tolist() == [-1] * 5
    assert tr.turn.tolist() == [-1] * 5
    assert np.isnan(tr.think_time_s).all()
    assert tr.num_sessions == 0


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"block_size_tokens": 0}, "block_size_tokens"),
        ({"clock": "wall"}, "clock"),
        ({"input_tokens": [1, 2, 3]}, "input_tokens"),
        ({"block_counts": [2, 1, 3, 3, 3]}, "block_offsets"),
        ({"session": [0, 1, 0, 0, 2]}, "session"),
    ],
)
def test_bad_columns_rejected(overrides: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _trace(**overrides)
