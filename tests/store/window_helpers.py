"""The embedded store's window-release tests' geometries, file and checks, shared with the
node service's tests."""

from __future__ import annotations

from pathlib import Path

import torch

from flatcake.cio.files import SESSIONS_DIR
from flatcake.geometry import KVGeometry, LayerGroup
from flatcake.store import FlatCakeStore
from tests.cio.helpers import window_pages_held

WINDOW = 3  # blocks: 48 tokens of 16


def windowed(sliding_entry: int) -> KVGeometry:
    """Two full layers (8 KiB a block), then two sliding-window layers of 48 tokens."""
    return KVGeometry(
        num_layers=4, tokens_per_block=16, dtype="uint8", name="release",
        groups=(LayerGroup(2, 512, kind="full"),
                LayerGroup(2, sliding_entry, window_tokens=48, kind="sliding")))


# 9344 B sliding blocks (not a multiple of 4 KiB: the staging path), 4096 B (zero-copy).
GEOMETRIES = {"staging": windowed(584), "zero-copy": windowed(256)}


def the_file(root: Path) -> Path:
    (path,) = sorted((root / SESSIONS_DIR).iterdir())
    return path


def sliding_pages_allocated(store: FlatCakeStore, path: Path) -> int:
    """What the sliding layers alone allocate (``SEEK_DATA``) in every segment."""
    return window_pages_held(path, ((int(s.file_offset or 0), s.layout)
                                    for s in store.control.segments()), WINDOW)


def assert_restored(dst: list[torch.Tensor], src: list[torch.Tensor], slots: list[int],
                    end: int) -> None:
    """Full layers: every block before ``end``; sliding: the window before it."""
    for layer in (0, 1):
        assert torch.equal(dst[layer][slots[:end]], src[layer][:end]), layer
    for layer in (2, 3):
        lo = max(0, end - WINDOW)
        assert torch.equal(dst[layer][slots[lo:end]], src[layer][lo:end]), layer
