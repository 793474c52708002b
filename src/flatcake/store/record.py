"""``ROOT/config.json``: the configuration a store was last opened with.

A store writes it every time it opens (after recovery succeeded), so offline tools
(``flatcake inspect``) report the store's own budgets, watermarks, placement thresholds
and geometry instead of whatever defaults the tool starts with. It is a record, not an
input: ``FlatCakeStore.open`` always uses the config it is given.

    {"flatcake_store_config": 1, "opened_at": "2026-12-02T21:00:00+00:00", "pid": 4242,
     "io_mode": "direct", "geometry": {KVGeometry fields}, "config": {FlatCakeConfig
     as nested sections}}

The ``engine`` section is left out: it is the engine hosts' (its ``tenant_salt`` names a
tenant's key space, which a record has no need to keep); a record read back gets its
defaults, as a record written before the section existed does.

Written to a temporary file and renamed, mode 0600, so a reader never sees half a file.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

from flatcake.config import FlatCakeConfig
from flatcake.geometry import KVGeometry

logger = logging.getLogger(__name__)

RECORD_NAME = "config.json"
RECORD_VERSION = 1


class StoreRecord(NamedTuple):
    """What ``read_record`` found: the config and geometry, when and how the store opened."""

    config: FlatCakeConfig
    geometry: KVGeometry
    opened_at: str
    io_mode: str


def write_record(root: str | os.PathLike[str], geometry: KVGeometry, config: FlatCakeConfig,
                 io_mode: str) -> Path | None:
    """Record the configuration of the store opening at ``root``. A record that cannot
    be written is logged and skipped: it is for tools, the store does not need it."""
    try:
        return _write(Path(root) / RECORD_NAME, geometry, config, io_mode)
    except (OSError, TypeError, ValueError) as exc:
        logger.warning("cannot record the store config in %s: %s", root, exc)
        return None


def _write(path: Path, geometry: KVGeometry, config: FlatCakeConfig, io_mode: str) -> Path:
    data = {"flatcake_store_config": RECORD_VERSION,
            "opened_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "pid": os.getpid(),
            "io_mode": io_mode, "geometry": geometry.to_record(),
            "config": {name: value for name, value in dataclasses.asdict(config).items()
                       if name != "engine"}}
    tmp = path.with_name(f".{RECORD_NAME}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_record(root: str | os.PathLike[str]) -> StoreRecord | None:
    """The record under ``root``, or None when the store never wrote one (made by an
    older FlatCake). A record that cannot be read raises ``ValueError`` naming it."""
    path = Path(root) / RECORD_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("flatcake_store_config") != RECORD_VERSION:
            raise ValueError(f"unknown version {data.get('flatcake_store_config')!r}")
        return StoreRecord(_config(data["config"]), KVGeometry.from_record(data["geometry"]),
                           str(data["opened_at"]), str(data["io_mode"]))
    except (OSError, KeyError, TypeError, AttributeError, json.JSONDecodeError,
            ValueError) as exc:
        raise ValueError(f"unreadable store config record {path}: {exc}") from None


def _config(data: dict[str, Any]) -> FlatCakeConfig:
    """A ``FlatCakeConfig`` from ``dataclasses.asdict`` output (validated as usual)."""
    defaults = FlatCakeConfig()
    parts: dict[str, Any] = {}
    for f in dataclasses.fields(FlatCakeConfig):
        default = getattr(defaults, f.name)
        if f.name == "engine":
            parts[f.name] = default
            continue
        value = data[f.name]
        if dataclasses.is_dataclass(default):
            # JSON has lists where the config has tuples.
            value = {k: tuple(v) if isinstance(getattr(default, k, None), tuple) else v
                     for k, v in value.items()}
            value = dataclasses.replace(default, **value)  # type: ignore[type-var]
        parts[f.name] = value
    return FlatCakeConfig(**parts)
