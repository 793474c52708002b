"""Pure arithmetic of the simulated FlatCake (``systems.flatcake``): block keys of dense
ids, the parts of a prefix hit a restore reads, and how much later a restore that fills
memory copies ends."""

from __future__ import annotations

import numpy as np

from flatcake.control.address import Medium
from flatcake.control.index import PrefixHit
from flatcake.replay.workload.runs import Runs


def make_keys(num_ids: int) -> list[bytes]:
    """32-byte keys, one per dense block id (list slices are C-speed)."""
    raw = np.zeros((num_ids, 4), dtype="<u8")
    raw[:, 0] = np.arange(num_ids, dtype=np.uint64)
    raw[:, 1] = 0x666C6174_63616B65  # "flatcake": keeps keys away from all-zero bytes
    blob = raw.tobytes()
    return [blob[i:i + 32] for i in range(0, len(blob), 32)]


def keys_of(keys: list[bytes], runs: Runs) -> tuple[bytes, ...]:
    """The keys of a request's blocks, in prefix order."""
    if not runs:
        return ()
    s, e = runs[0]
    out = keys[s:e]
    for s, e in runs[1:]:
        out += keys[s:e]  # list slices and extends copy pointers at C speed
    return tuple(out)


def refill_wait_s(read_s: float, copy_s: float, num_layers: int) -> float:
    """How much later a restore ends when it also fills memory copies
    (``placement.copy_on_restore``), as the executor does it (``cio.refill``): each
    layer is copied device-to-host (``copy_s`` in all, at the host<->GPU link's
    bandwidth; PCIe carries both directions at once, so the copies do not queue behind
    host->GPU loads) once its reads land, while the next layer's reads are in flight.
    A two-stage pipeline of ``num_layers`` equal steps ends ``copy_s / L + (L - 1) *
    max(read_s, copy_s) / L`` after the first layer's reads, i.e. one layer's copy after
    the reads when copying is the faster stage."""
    n = max(num_layers, 1)
    return copy_s / n + (n - 1) * max(copy_s - read_s, 0.0) / n


def memory_run(hit: PrefixHit, start: int) -> int:
    """How many blocks from ``start`` on the hit holds in host memory, contiguously."""
    n = 0
    pos = start
    for seg, _start_pos, count, prefix_start in hit.runs:
        end = prefix_start + count
        if end <= pos:
            continue
        if seg.medium != Medium.MEMORY:
            break
        n += end - pos
        pos = end
    return n
