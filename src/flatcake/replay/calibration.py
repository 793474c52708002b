"""Measured fixed costs for the ``local`` preset, read from a calibration file.

``flatcake bench --calibrate`` (``flatcake.bench.calibrate``) times real restores through
the store on the disk at hand and writes a JSON file with ``restore_overhead_s`` (fixed
cost of one restore) and ``command_s`` (cost of one more read command). The replay does
no I/O and imports no I/O code, so it takes those numbers from the file:

* ``with_calibration(preset, path)``: the preset with ``node.restore_overhead_s`` set to
  the measured fixed cost, and the SSD's commands in flight and latency set so that a
  restore pays ``command_latency_s / queue_depth = command_s`` per command (the replay's
  SSD model): ``queue_depth = max(1, floor(latency / command_s))`` with the preset's
  device latency, then ``command_latency_s = command_s x queue_depth``. A command read
  alone (Mooncake's sequential ``pread``, queue depth 1) so costs at most the device
  latency already in the preset, unless the store's own path is slower than that per
  command, which every system then pays;
* ``get_preset("local")`` applies the file named by ``$FLATCAKE_CALIBRATION`` when set.

Without a file, ``local`` keeps the figures stored in ``replay.presets`` (measured on the
development machine, and said so by ``--explain``); ``paper`` always keeps its
documented guess.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flatcake.replay.presets import ReplayPreset

CALIBRATION_ENV = "FLATCAKE_CALIBRATION"
FORMAT = "flatcake-calibration/1"
"""Must match ``flatcake.bench.calibrate.FORMAT`` (tests check both)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Calibration:
    """The numbers the replay takes from a calibration file.

    Attributes:
        restore_overhead_s: fixed cost of one restore (s).
        command_s: cost of one more read command in a restore (s).
        source: where they came from, for ``--explain``.
    """

    restore_overhead_s: float
    command_s: float
    source: str


def load_calibration(path: str | Path) -> Calibration:
    """Read and check a file written by ``flatcake bench --calibrate``."""
    p = Path(path)
    try:
        data: Any = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read calibration file {p}: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{p} is not a calibration file (format {FORMAT!r}); write one "
                         f"with 'flatcake bench --calibrate'")
    values = {}
    for name in ("restore_overhead_s", "command_s"):
        v = data.get(name)
        if (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)
                or v < 0):
            raise ValueError(f"calibration file {p}: {name} must be a number >= 0, "
                             f"got {v!r}")
        values[name] = float(v)
    when = data.get("measured_at", "?")
    where = data.get("directory", "?")
    return Calibration(values["restore_overhead_s"], values["command_s"],
                       f"measured by flatcake bench --calibrate under {where} at {when} "
                       f"({p})")


def with_costs(preset: ReplayPreset, cal: Calibration) -> ReplayPreset:
    """``preset`` charging ``cal``'s fixed cost per restore and cost per command."""
    node = preset.node
    ssd = node.ssd
    if cal.command_s > 0:
        qd = max(1, math.floor(ssd.command_latency_s / cal.command_s))
        ssd = dataclasses.replace(ssd, queue_depth=qd, command_latency_s=cal.command_s * qd)
    node = dataclasses.replace(node, ssd=ssd, restore_overhead_s=cal.restore_overhead_s)
    return dataclasses.replace(preset, node=node, cost_source=cal.source)


def with_calibration(preset: ReplayPreset, path: str | Path) -> ReplayPreset:
    """``preset`` with the measured fixed costs of the calibration file ``path``."""
    return with_costs(preset, load_calibration(path))
