"""Fixtures for the trace toolkit tests: tiny trace files and the shared real traces."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# The repository's sibling ``shared/traces`` (CI lays a copy of shared/ beside the clone);
# FLATCAKE_SHARED_TRACES points elsewhere.
SHARED_TRACES = Path(os.environ.get(
    "FLATCAKE_SHARED_TRACES",
    Path(__file__).resolve().parents[2].parent / "shared" / "traces"))


def _encode(records: list[Any] | str) -> bytes:
    if isinstance(records, str):
        return records.encode()
    return b"".join(
        (r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in records)


@pytest.fixture
def write_lines(tmp_path: Path) -> Callable[..., Path]:
    """Write JSON records (dicts or raw bytes lines) or raw text to a file, gzip on demand."""

    def write(name: str, records: list[Any] | str, *, gz: bool = False) -> Path:
        path = tmp_path / name
        data = _encode(records)
        path.write_bytes(gzip.compress(data) if gz else data)
        return path

    return write


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    if not (SHARED_TRACES / "stats.json").is_file():
        pytest.skip(f"shared traces not found at {SHARED_TRACES}")
    return SHARED_TRACES
