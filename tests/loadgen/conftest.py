"""Fixtures of the load-generator tests: the fake server and the shared real traces."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.loadgen.helpers import FakeServer

SHARED_TRACES = Path(os.environ.get(
    "FLATCAKE_SHARED_TRACES",
    Path(__file__).resolve().parents[2].parent / "shared" / "traces"))


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as srv:
        yield srv


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    if not (SHARED_TRACES / "stats.json").is_file():
        pytest.skip(f"shared traces not found at {SHARED_TRACES}")
    return SHARED_TRACES
