"""Builders shared by the robustness tests that damage a store at rest: a pristine
store of sessions over several files (``build``) and one random corruption of one of its
files (``corrupt``)."""

from __future__ import annotations

import random
from pathlib import Path

from flatcake.cio.files import SESSIONS_DIR
from flatcake.cio.filescan import scan_session_file
from flatcake.store import FlatCakeStore
from tests.robustness import workload as w
from tests.store.helpers import SMALL

# Small spans so sessions run over several files (damage in an early file drops the
# later ones too); turn sizes from one block to a 40-block, multi-page segment.
CONFIG = ("store.session_file_bytes=65536",)
TURNS = {0: [4, 8, 12, 40, 48], 1: [1, 2, 3, 4, 5, 6, 7, 8], 2: [16, 32, 48], 3: [48]}
KINDS = ("flip", "flip", "header_flip", "zero_page", "zero_range", "truncate")


def build(root: Path) -> dict[int, list[int]]:
    """The pristine store; returns each session's acknowledged turn ends."""
    acked: dict[int, list[int]] = {s: [] for s in TURNS}
    with FlatCakeStore.open(root, SMALL, w.config(*CONFIG)) as store:
        for s, ends in TURNS.items():
            for end in ends:
                assert w.store_turn(store, s, end)
                acked[s].append(end)
    return acked


def corrupt(root: Path, rng: random.Random) -> tuple[str, bool]:
    """Damage one file; returns (what was done, whether it was a truncation exactly at
    a segment boundary)."""
    path = rng.choice(sorted((root / SESSIONS_DIR).glob("*.fcs")))
    size = path.stat().st_size
    kind = rng.choice(KINDS)
    at_boundary = False
    with open(path, "r+b") as fh:
        if kind in ("flip", "header_flip"):
            offset = rng.randrange(4096 if kind == "header_flip" else size)
            fh.seek(offset)
            byte = fh.read(1)[0]
            fh.seek(offset)
            fh.write(bytes([byte ^ rng.randrange(1, 256)]))
        elif kind == "zero_page":
            offset = rng.randrange(size // 4096) * 4096
            fh.seek(offset)
            fh.write(bytes(4096))
        elif kind == "zero_range":
            offset = rng.randrange(size)
            length = rng.randrange(1, 65536)
            fh.seek(offset)
            fh.write(bytes(min(length, size - offset)))
        else:
            offset = rng.randrange(size)
            _, segs, _ = scan_session_file(path)
            at_boundary = offset in {s.file_offset for s in segs} or offset == 4096
            fh.truncate(offset)
    return f"{kind} {path.name} @ {offset}", at_boundary
