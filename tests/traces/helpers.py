"""Traces the analyzer and wear tests share."""

from __future__ import annotations

import numpy as np

from flatcake.traces import Trace, build_trace


def global_trace() -> Trace:
    """Four requests on one clock, 4-token blocks, worked by hand in the tests:

        r0 t=0.0  [1 2 3]      r1 t=1.5 [1 2 4]
        r2 t=3.0  [5]          r3 t=10  [1 2 3 6]

    6 distinct blocks (4, 5, 6 used once), 5 of 11 accesses prefix hits."""
    lists = [[1, 2, 3], [1, 2, 4], [5], [1, 2, 3, 6]]
    return build_trace(
        name="tiny", source_format="test", block_size_tokens=4, clock="global",
        has_hashes=True, partial_last_block=True, time_s=[0.0, 1.5, 3.0, 10.0],
        input_tokens=[12, 12, 3, 16], output_tokens=[1, 2, 3, 4],
        block_counts=[len(x) for x in lists],
        block_hashes=np.array([i for x in lists for i in x], dtype=np.int64))
