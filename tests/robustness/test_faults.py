"""I/O errors while serving: EIO and ENOSPC injected into writes, syncs and reads
through a test double, and a real small ext4 filesystem that fills up (when the
machine lets a test mount a loop device; skipped otherwise).

Every fault is a clean failure of the one call that met it: ``store_turn`` returns
with ``error`` set and nothing stored (never an exception, never a broken session), a
read error makes a load shorter and reports its damage. No wrong byte is served, and
every acknowledged turn is restored or its session reported damaged.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flatcake.store import FlatCakeStore, fsck_root
from tests.robustness import workload as w
from tests.store.helpers import SMALL, empty_kv

FAULTS = (errno.EIO, errno.ENOSPC)


class FaultyCalls:
    """Wraps ``os`` calls so that each fails with probability ``p`` (EIO or ENOSPC)."""

    def __init__(self, rng: random.Random, p: float) -> None:
        self.rng = rng
        self.p = p
        self.on = True
        self.injected = 0

    def wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            if self.on and self.rng.random() < self.p:
                self.injected += 1
                code = self.rng.choice(FAULTS)
                raise OSError(code, os.strerror(code))
            return real(*args)
        return call


def _run(store: FlatCakeStore, rng: random.Random, sessions: list[int],
         acked: dict[int, list[int]], reported: dict[int, bool], verdict: w.Verdict,
         steps: int) -> int:
    """Random turns and loads; returns the number of failed store_turn calls."""
    ends = {s: store.lookup(w.keys(s)).num_blocks for s in sessions}
    failed = 0
    for _ in range(steps):
        s = rng.choice(sessions)
        if rng.random() < 0.6 and ends[s] < w.MAX_BLOCKS:
            end = min(w.MAX_BLOCKS, ends[s] + rng.randint(1, 6))
            res = store.store_turn(w.session_name(s), w.keys(s)[:end], w.source(s),
                                   range(end), w.TO_SSD)
            if res.error:
                failed += 1
                assert res.num_blocks == 0 and res.medium is None
                ends[s] = store.lookup(w.keys(s)).num_blocks
            elif res.num_blocks:
                acked[s].append(end)
                ends[s] = end
        else:
            dst = empty_kv(SMALL, w.MAX_BLOCKS)
            res_l = store.load(w.keys(s), dst, range(w.MAX_BLOCKS))
            reported[s] = reported[s] or res_l.damaged_segments > 0
            if not w.served_bytes_ok(dst, s, res_l.num_blocks):
                verdict.wrong_bytes += 1
            ends[s] = store.lookup(w.keys(s)).num_blocks
    return failed


def test_eio_and_enospc_on_writes_syncs_and_reads(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(12)
    faults = FaultyCalls(rng, p=0.08)
    for name in ("pwrite", "fdatasync", "preadv", "fsync"):
        monkeypatch.setattr(os, name, faults.wrap(getattr(os, name)))
    sessions = list(range(500, 506))
    acked: dict[int, list[int]] = {s: [] for s in sessions}
    reported = dict.fromkeys(sessions, False)
    verdict = w.Verdict()
    faults.on = False
    with FlatCakeStore.open(tmp_path, SMALL, w.config()) as store:
        faults.on = True
        failed = _run(store, rng, sessions, acked, reported, verdict, steps=300)
        faults.on = False
        store.control.check_integrity()
    assert faults.injected > 10 and failed > 0
    with FlatCakeStore.open(tmp_path, SMALL, w.config()) as store:
        for s in sessions:
            w.verify(store, s, acked[s], verdict, reported[s] or bool(
                set(store.recovery.damaged_file_ids)))
        # The sessions keep working after the faults.
        for s in sessions:
            if store.lookup(w.keys(s)).num_blocks < w.MAX_BLOCKS:
                assert w.store_turn(store, s, w.MAX_BLOCKS)
    assert verdict.wrong_bytes == 0 and verdict.unreported_lost_turns == 0, verdict.notes
    assert all(f.ok for f in fsck_root(tmp_path).files if not f.quarantined)


@pytest.fixture
def small_ext4(tmp_path: Path) -> Iterator[Path]:
    """A freshly made 16 MiB ext4 filesystem on a loop device, unmounted after."""
    if os.geteuid() != 0 or not shutil.which("mkfs.ext4"):
        pytest.skip("needs root and mkfs.ext4 to mount a loop device")
    image, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(image, "wb") as fh:
        fh.truncate(16 << 20)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True)
    mounted = made.returncode == 0 and subprocess.run(
        ["mount", "-o", "loop", str(image), str(mnt)], capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("cannot mount a loop device here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_a_real_filesystem_that_fills_up(small_ext4: Path) -> None:
    # The budget (1 GiB) is larger than the filesystem (16 MiB): the disk fills first.
    root = small_ext4 / "store"
    cfg = w.config("store.ssd_capacity_bytes=1073741824")
    acked: dict[int, list[int]] = {}
    full = 0
    with FlatCakeStore.open(root, SMALL, cfg) as store:
        s = 0
        while full < 20:
            s += 1
            acked[s] = []
            for end in (12, 24, 36, 48):
                if w.store_turn(store, s, end):
                    acked[s].append(end)
                else:
                    full += 1
                    break
        # Freeing space makes writes work again.
        for victim in list(acked)[:len(acked) // 2]:
            store.drop_session(w.session_name(victim))
            del acked[victim]
        s += 1
        acked[s] = [48] if w.store_turn(store, s, 48) else []
        assert acked[s] == [48]
        store.control.check_integrity()
    verdict = w.Verdict()
    with FlatCakeStore.open(root, SMALL, cfg) as store:
        for s, ends in acked.items():
            w.verify(store, s, ends, verdict, reported=False)
    assert verdict.wrong_bytes == 0 and verdict.restored_turns == verdict.acknowledged_turns
    assert fsck_root(root).ok


def test_defaults_hold_many_turns_on_a_16_mib_filesystem(small_ext4: Path) -> None:
    # Default config (64 GiB spans and budget): nothing is preallocated, so a small
    # filesystem holds turns until it is actually full.
    from flatcake.config import FlatCakeConfig

    root = small_ext4 / "store"
    with FlatCakeStore.open(root, SMALL, FlatCakeConfig()) as store:
        stored = sum(w.store_turn(store, s, 48) for s in range(1000, 1040))
    assert stored == 40  # 40 turns of 48 blocks (~150 KB each) = 6 MB
