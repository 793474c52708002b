"""A workload re-cut into blocks of several trace blocks each.

A model whose cache entries span more tokens than the trace's block (DeepSeek-V4-Flash's
compressed-128x layers keep one entry per 128 tokens; the Claude Code trace hashes
64-token blocks) is served in blocks of whole entries: the store's block for such a
model is a multiple of every entry (``LayerGroup.block_bytes``), and vLLM aligns a
hybrid model's prefix hit to its scheduler block, a multiple of every group's block
(``v1/core/kv_cache_coordinator.py``, ``_cache_hit_alignment_tokens``). ``recut``
gives the replay those blocks: block ``j`` of a request is its trace blocks
``[j * factor, (j + 1) * factor)``, one new id per distinct tuple of trace ids; a
request's last ``len % factor`` trace blocks (a partial entry) are no block at all, so no
system stores or restores them and every system recomputes them, as the engines do
with a partial block.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from flatcake.replay.workload.trace import Workload, dense_runs, expand_runs


def recut(wl: Workload, factor: int) -> Workload:
    """``wl`` in blocks of ``factor`` trace blocks (``wl`` itself for 1)."""
    if not isinstance(factor, int) or factor <= 0:
        raise ValueError(f"recut factor must be a positive int, got {factor!r}")
    if factor == 1:
        return wl
    ids = expand_runs(wl.run_start, wl.run_len).astype(np.int64)
    per_req = wl.blocks_per_request()
    first = np.zeros(len(per_req) + 1, dtype=np.int64)
    np.cumsum(per_req, out=first[1:])
    kept = per_req // factor
    # Position of the first trace block of each new block, request by request.
    new_ptr = np.zeros(len(kept) + 1, dtype=np.int64)
    np.cumsum(kept, out=new_ptr[1:])
    owner = np.repeat(np.arange(len(kept)), kept)
    pos = first[owner] + (np.arange(int(new_ptr[-1])) - new_ptr[owner]) * factor
    key = ids[pos] if len(pos) else np.zeros(0, dtype=np.int64)
    n = max(wl.num_ids, 1)
    for k in range(1, factor):  # one dense id per distinct tuple of trace ids
        uniq, inv = np.unique(key * n + ids[pos + k], return_inverse=True)
        key = inv.astype(np.int64)
        n = max(len(uniq), 1)
    # New ids in order of first use, so a request's new blocks stay a few runs.
    _, first_use, inv = np.unique(key, return_index=True, return_inverse=True)
    rank = np.empty(len(first_use), dtype=np.int64)
    rank[np.argsort(first_use, kind="stable")] = np.arange(len(first_use))
    run_ptr, run_start, run_len, num_ids = dense_runs(new_ptr, rank[inv])
    return dataclasses.replace(wl, block_tokens=wl.block_tokens * factor, num_ids=num_ids,
                               run_ptr=run_ptr, run_start=run_start, run_len=run_len)
