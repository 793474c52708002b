"""The replay's fixed costs measured on the disk at hand: ``flatcake bench --calibrate``.

The replay charges every SSD restore ``restore_overhead_s`` (lookup, planning, submission,
completion) on top of its device time, and every read command ``command_latency_s /
queue_depth``. This module measures both through the real store (``FlatCakeStore.load``:
lookup, read plan, O_DIRECT reads, per-layer crc32 checks, scatter into the paged KV),
with three one-layer sessions of 8 KiB blocks, each written in one turn on SSD:

* ``one``: one block, restored with 1 command of 8 KiB;
* ``few``: ``n`` blocks, restored with 1 command of ``n`` x 8 KiB;
* ``many``: ``n`` blocks in a second store whose planner splits reads at 8 KiB
  (``max_read_bytes``): ``n`` commands of 8 KiB, the same bytes and the same one segment.

Restores of the three alternate for ``rounds`` rounds after one warm-up round; medians
are kept. ``many`` and ``few`` read the same bytes from one segment each, so their
difference is ``n - 1`` commands::

    command_s = (t_many - t_few) / (n - 1)
    restore_overhead_s = t_one - command_s - (t_few - t_one) / (n - 1)

(the last term is one block's share of the byte-dependent time). Negative results of a
noisy disk are clamped to 0. ``write_calibration`` saves them as JSON for
``replay.calibration`` (the replay imports no I/O code; it reads the file), and
``preset_snippet`` says how to use it.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from flatcake.bench.control_cost import session_keys
from flatcake.config import FlatCakeConfig, PlannerConfig, StoreConfig
from flatcake.control.address import Medium
from flatcake.geometry import KVGeometry
from flatcake.store.results import TurnSignals
from flatcake.store.store import FlatCakeStore

FORMAT = "flatcake-calibration/1"
GEOMETRY = KVGeometry(num_layers=1, tokens_per_block=16, num_kv_heads=1, head_dim=128,
                      dtype="float16", name="calibration-8KiB")
"""One layer, 8 KiB per block: a block is one whole O_DIRECT command."""


@dataclass(frozen=True, slots=True)
class RestoreCosts:
    """What one calibration measured (seconds are medians over ``rounds``).

    Attributes:
        restore_overhead_s: fixed cost of one restore (the replay's
            ``NodeSpec.restore_overhead_s``).
        command_s: cost of one more read command (and segment) in a restore; the replay
            charges ``command_latency_s / queue_depth`` per command.
        one_s / few_s / many_s: the three restores' median wall seconds.
        commands: ``n``, the commands of the ``many`` restore.
        rounds: restores of each kind.
        directory: where the session files were.
    """

    restore_overhead_s: float
    command_s: float
    one_s: float
    few_s: float
    many_s: float
    commands: int
    rounds: int
    directory: str


def fit_costs(one_s: float, few_s: float, many_s: float, commands: int
              ) -> tuple[float, float]:
    """``(restore_overhead_s, command_s)`` from the three medians (module docstring)."""
    if commands < 2:
        raise ValueError(f"commands must be >= 2, got {commands}")
    for name, v in (("one_s", one_s), ("few_s", few_s), ("many_s", many_s)):
        if not v >= 0:
            raise ValueError(f"{name} must be >= 0, got {v!r}")
    command = max(0.0, (many_s - few_s) / (commands - 1))
    per_block = max(0.0, (few_s - one_s) / (commands - 1))
    return max(0.0, one_s - command - per_block), command


def _store_session(store: FlatCakeStore, keys: list[bytes], kv: torch.Tensor) -> None:
    ids = torch.arange(len(keys), dtype=torch.int64)
    res = store.store_turn("calibrate", keys, [kv], ids,
                           TurnSignals(turn_index=0, context_tokens=len(keys) * 16))
    if res.medium != Medium.SSD or res.num_blocks != len(keys):
        raise RuntimeError(f"calibration stored {res.num_blocks} blocks on {res.medium}, "
                           f"expected {len(keys)} on SSD")


def _config(read_threads: int, max_read_bytes: int) -> FlatCakeConfig:
    return FlatCakeConfig(
        store=StoreConfig(io_mode="direct", read_threads=read_threads,
                          memory_capacity_bytes=0, ssd_capacity_bytes=1 << 30,
                          session_file_bytes=64 << 20),
        planner=PlannerConfig(max_read_bytes=max_read_bytes))


def measure_restore_costs(directory: str | Path, *, commands: int = 64, rounds: int = 15,
                          read_threads: int = 4) -> RestoreCosts:
    """Write the sessions under ``directory`` (removed afterwards) and time their
    restores through ``FlatCakeStore.load``."""
    if commands < 2:
        raise ValueError(f"commands must be >= 2, got {commands}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    base = Path(directory)
    base.mkdir(parents=True, exist_ok=True)
    bbpl = GEOMETRY.block_bytes_per_layer
    kv = torch.randint(0, 256, (commands, bbpl), dtype=torch.uint8)
    keys = session_keys(GEOMETRY, commands)
    one_keys = session_keys(GEOMETRY, 1, seed=1)
    times: dict[str, list[float]] = {"one": [], "few": [], "many": []}
    with tempfile.TemporaryDirectory(prefix="flatcake-calibrate-", dir=base) as root, \
            FlatCakeStore.open(Path(root) / "whole", GEOMETRY,
                               _config(read_threads, 64 << 20)) as whole, \
            FlatCakeStore.open(Path(root) / "split", GEOMETRY,
                               _config(read_threads, bbpl)) as split:
        _store_session(whole, one_keys, kv[:1])
        _store_session(whole, keys, kv)
        _store_session(split, keys, kv)
        runs = {"one": (whole, one_keys), "few": (whole, keys), "many": (split, keys)}
        dest = torch.zeros_like(kv)
        table = torch.arange(commands, dtype=torch.int64)
        for r in range(rounds + 1):  # round 0 warms up (thread pool, buffers)
            for name, (store, k) in runs.items():
                t0 = time.perf_counter()
                res = store.load(k, [dest], table[:len(k)])
                if r:
                    times[name].append(time.perf_counter() - t0)
                if res.num_blocks != len(k):
                    raise RuntimeError(f"calibration restore {name} got {res.num_blocks} "
                                       f"of {len(k)} blocks")
    med = {k: statistics.median(v) for k, v in times.items()}
    overhead, command = fit_costs(med["one"], med["few"], med["many"], commands)
    return RestoreCosts(overhead, command, med["one"], med["few"], med["many"], commands,
                        rounds, str(base))


def write_calibration(path: str | Path, costs: RestoreCosts) -> Path:
    """Save ``costs`` as the JSON file ``replay.calibration.load_calibration`` reads."""
    out = Path(path)
    data = {"format": FORMAT, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                           time.gmtime()),
            **asdict(costs)}
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return out


def preset_snippet(costs: RestoreCosts, path: str | Path) -> str:
    """What to tell the user: the numbers and how the ``local`` preset takes them."""
    return "\n".join([
        f"measured under {costs.directory} ({costs.rounds} rounds, medians): restore of 1 "
        f"command {costs.one_s * 1e6:,.0f} us, 1 command of {costs.commands} blocks "
        f"{costs.few_s * 1e6:,.0f} us, {costs.commands} commands "
        f"{costs.many_s * 1e6:,.0f} us",
        f"  restore_overhead_s = {costs.restore_overhead_s:.6g}   # fixed cost per restore",
        f"  command_s = {costs.command_s:.6g}   # per read command",
        f"written to {path}; the local replay preset uses it with",
        f"  FLATCAKE_CALIBRATION={path} flatcake replay --preset local --explain",
    ])
