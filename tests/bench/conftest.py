"""Shared fixtures: a directory that takes O_DIRECT (the bench refuses anything else)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flatcake.cio.direct import probe_direct_io


@pytest.fixture
def direct_dir(tmp_path: Path) -> Path:
    probe = probe_direct_io(tmp_path)
    if not probe.supported:
        pytest.skip(f"{tmp_path} ({probe.fs_type}) has no O_DIRECT: {probe.reason}")
    return tmp_path
