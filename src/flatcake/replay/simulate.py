"""One replay run: a workload, a system, a rate, a preset -> ``RunMetrics``."""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from flatcake.geometry import KVGeometry
from flatcake.replay.node.metrics import Recorder, RunMetrics, summarize
from flatcake.replay.node.node import Node
from flatcake.replay.presets import ReplayPreset
from flatcake.replay.systems import make_system
from flatcake.replay.workload.recut import recut
from flatcake.replay.workload.trace import Workload

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (back to its previous state
    after). A replay allocates a few container objects per block and request (index
    entries, hit runs) and keeps millions of them alive, so every full collection walks
    them all: 10-30% of a run's CPU for nothing, since a run makes no cyclic garbage
    until it ends. Its state is cyclic garbage once the run is dropped: one collection on
    entry frees an earlier run's, so a process replaying run after run (a sweep's
    workers) holds one run's state at a time."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def replay_blocks(workload: Workload, preset: ReplayPreset) -> tuple[Workload, KVGeometry]:
    """``workload`` and the preset's geometry at the replay's block: the trace's block,
    or the smallest multiple of it that holds whole entries of every layer group
    (``LayerGroup.tokens_per_entry``), the trace re-cut into it (``workload.recut``);
    ``ValueError`` when one GPU's KV pool cannot hold the trace's largest request."""
    block = preset.geometry.whole_entry_tokens(workload.block_tokens)
    workload = _recut_once(workload, block // workload.block_tokens)
    geometry = preset.geometry.with_block_size(workload.block_tokens)
    max_blocks = int(workload.blocks_per_request().max(initial=0))
    max_out = int(workload.output_tokens.max(initial=0))
    need = ((max_blocks + -(-max_out // workload.block_tokens))
            * geometry.history_block_bytes)
    if need > preset.node.gpu.kv_capacity_bytes:
        raise ValueError(
            f"preset {preset.name!r}: gpu.kv_capacity_bytes={preset.node.gpu.kv_capacity_bytes}"
            f" is smaller than the trace's largest request ({need} bytes)")
    return workload, geometry


_RECUT: list[tuple[Workload, int, Workload]] = []


def _recut_once(workload: Workload, factor: int) -> Workload:
    """``recut(workload, factor)``, remembered for the last workload (a process
    replaying one trace run after run re-cuts it once)."""
    if factor == 1:
        return workload
    if _RECUT and _RECUT[0][0] is workload and _RECUT[0][1] == factor:
        return _RECUT[0][2]
    out = recut(workload, factor)
    _RECUT[:] = [(workload, factor, out)]
    return out


def run_replay(workload: Workload, system: str, rate_req_s: float, preset: ReplayPreset,
               seed: int = 0) -> RunMetrics:
    """Replay ``workload`` on ``system`` at ``rate_req_s`` requests per second."""
    return replay_node(workload, system, rate_req_s, preset, seed)[0]


def replay_node(workload: Workload, system: str, rate_req_s: float, preset: ReplayPreset,
                seed: int = 0) -> tuple[RunMetrics, Node]:
    """Like ``run_replay`` but also returns the finished ``Node`` (per-request columns in
    ``node.rec``, the system's state in ``node.system``), for tests and analysis."""
    workload, geometry = replay_blocks(workload, preset)
    sysobj = make_system(system, preset.flatcake_config(), preset.tiered)
    node = Node(workload, sysobj, preset.node, geometry, rate_req_s, seed,
                think_cap_s=preset.think_cap_s)
    m = timed_run(node.run, sysobj.extra_metrics, workload, system, rate_req_s, preset,
                  seed)
    logger.info("%s at %g req/s: %.1f s wall", system, rate_req_s, m.wall_s)
    return m, node


def timed_run(run: Callable[[], Recorder], extra: Callable[[], dict[str, Any]],
              workload: Workload, system: str, rate_req_s: float, preset: ReplayPreset,
              seed: int) -> RunMetrics:
    """Run an event loop (a node's or a cluster's) with the cyclic collector paused,
    timed in wall and CPU seconds, and summarise it (``run_metrics``)."""
    start = time.perf_counter()
    cpu0 = time.process_time()
    with gc_paused():
        rec = run()
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    return run_metrics(rec, extra(), workload, system, rate_req_s, preset, seed, wall, cpu)


def run_metrics(rec: Recorder, extra: dict[str, Any], workload: Workload, system: str,
                rate_req_s: float, preset: ReplayPreset, seed: int, wall_s: float,
                cpu_s: float) -> RunMetrics:
    """A finished run's ``RunMetrics``: the recorder plus the system's counters."""
    placements = extra.pop("placements", {})
    never_read = extra.pop("ssd_never_read_bytes", math.nan)
    extra["num_events"] = rec.num_events
    return summarize(rec, system=system, rate_req_s=rate_req_s, preset=preset.name,
                     trace=workload.name, seed=seed, input_tokens=workload.input_tokens,
                     output_tokens=workload.output_tokens, placements=placements,
                     wall_s=wall_s, cpu_s=cpu_s, extra=extra,
                     ssd_never_read_bytes=never_read)
