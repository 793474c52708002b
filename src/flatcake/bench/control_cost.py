"""Control-plane cost of a restore: index lookup + read planning, no I/O.

``prepare_load`` is exactly what the store runs before a restore's first read: look the
request's keys up in the block index, plan the per-layer merged reads, pin the
sessions. Its wall time is the control plane's share of a restore; the bench compares
it with the restore itself.

``session_keys`` and ``split_turns`` fix the request shape every part of the bench
shares: a session of ``context_tokens`` tokens, written in ``num_turns`` appended turns
of (nearly) equal size, keyed with the store's own chained block keys.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from flatcake.config import FlatCakeConfig, PlacementConfig, StoreConfig
from flatcake.control import ControlPlane
from flatcake.control.keys import chain_block_keys
from flatcake.geometry import KVGeometry
from flatcake.plan.reads import plan_reads

TIB = 1 << 40


def split_turns(num_blocks: int, num_turns: int) -> list[range]:
    """Blocks ``[0, num_blocks)`` cut into ``num_turns`` consecutive, non-empty turns."""
    if num_turns < 1 or num_turns > num_blocks:
        raise ValueError(f"num_turns must be in [1, {num_blocks}] for {num_blocks} blocks, "
                         f"got {num_turns}")
    bounds = [num_blocks * t // num_turns for t in range(num_turns + 1)]
    return [range(bounds[t], bounds[t + 1]) for t in range(num_turns)]


def session_keys(geometry: KVGeometry, num_blocks: int, *, seed: int = 0,
                 model: str | None = None) -> list[bytes]:
    """Chained block keys of a session of ``num_blocks`` full blocks of random tokens."""
    rng = random.Random(seed)
    tokens = [rng.randrange(128_000) for _ in range(num_blocks * geometry.tokens_per_block)]
    return chain_block_keys(tokens, geometry.tokens_per_block, model or geometry.name)


def time_prepare_load(control: ControlPlane, keys: Sequence[bytes], *, repeats: int = 5
                      ) -> tuple[float, int]:
    """Median wall time (ms) of ``prepare_load`` + ``complete_load`` of ``keys``, planned
    with ``plan_reads``, and the plan's SSD command count."""
    times = []
    commands = 0
    for i in range(max(1, repeats)):
        t0 = time.perf_counter()
        plan = control.prepare_load(("bench-lookup", i), keys, planner=plan_reads)
        times.append(time.perf_counter() - t0)
        control.complete_load(("bench-lookup", i))
        commands = plan.read_plan.num_commands
        if plan.hit.num_blocks != len(keys):
            raise RuntimeError(f"control plane found {plan.hit.num_blocks} of {len(keys)} "
                               f"blocks of the bench request")
    times.sort()
    return 1000.0 * times[len(times) // 2], commands


def control_plane_at_scale(geometry: KVGeometry, context_tokens: int, num_turns: int, *,
                           repeats: int = 5, seed: int = 0) -> tuple[float, int, int]:
    """Books of one session of ``context_tokens`` tokens in ``num_turns`` SSD turns,
    without writing its bytes (the control plane does no I/O); returns (median
    lookup_and_plan_ms, num_blocks, planned SSD commands)."""
    num_blocks = context_tokens // geometry.tokens_per_block
    keys = session_keys(geometry, num_blocks, seed=seed)
    # No memory copies: every turn is read from its SSD home, the case being timed.
    config = FlatCakeConfig(placement=PlacementConfig(memory_copy_watermark=0.0),
                            store=StoreConfig(ssd_capacity_bytes=64 * TIB,
                                              session_file_bytes=64 * TIB // 16))
    control = ControlPlane(geometry, config)
    for turn, blocks in enumerate(split_turns(num_blocks, num_turns)):
        plan = control.prepare_store("bench-session", keys[:blocks.stop], turn_index=turn,
                                     context_tokens=blocks.stop * geometry.tokens_per_block)
        if plan is None:
            raise RuntimeError(f"turn {turn} stored nothing")
        control.complete_store(plan, ok=True)
    ms, commands = time_prepare_load(control, keys, repeats=repeats)
    return ms, num_blocks, commands
