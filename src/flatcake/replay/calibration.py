"""Measured fixed costs for the ``local`` preset, read from a calibration file.

``flatcake bench --calibrate`` (``flatcake.bench.calibrate``) times real restores through
the store on the disk at hand and writes a JSON file with ``restore_overhead_s`` (fixed
cost of one restore) and ``command_s`` (cost of one more read command). The replay does
no I/O and imports no I/O code, so it takes those numbers from the file:

* ``presets.with_calibration(preset, path)``: the preset with ``node.restore_overhead_s`` set to
  the measured fixed cost (every system pays it, as the guess it replaces) and
  ``node.store_command_s`` to the measured cost per command: FlatCake's restores pay it
  instead of the SSD model's ``command_latency_s / queue_depth``. The baselines' read
  paths were not measured, so they keep the drive's figures (``bench.disk``);
  whichever way the measurement falls, no baseline is charged a cost measured on
  FlatCake's code;
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
from typing import Any

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
