"""SIGKILL at random moments while a child process writes several sessions (and while
it opens, recovers and cuts): after each kill the store reopens, every acknowledged
turn is restored byte for byte, no wrong byte is served, and ``fsck`` finds nothing.

A kill is not a power cut: what the child wrote is in the page cache, so an
acknowledged turn may not be lost at all (a power cut is the corruption suite's job).

``FLATCAKE_ROBUSTNESS_KILLS`` sets the number of kills (default 100).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import time
from collections import defaultdict
from multiprocessing.connection import Connection
from pathlib import Path

from flatcake.store import FlatCakeStore, fsck_root
from tests.robustness import workload as w
from tests.store.helpers import SMALL

KILLS = int(os.environ.get("FLATCAKE_ROBUSTNESS_KILLS", "100"))
SESSIONS_PER_ROOT = 400  # more than the kills on one root can fill
ACTIVE = 4  # sessions a writer grows at once
KILLS_PER_ROOT = 10


def writer(root: str, base: int, seed: int, conn: Connection) -> None:
    """Child: grow sessions ``base, base + 1, ...`` turn by turn, a few at a time (a
    full session makes room for the next), acknowledging each durable turn to the
    parent (``conn.send`` writes the pipe synchronously: an ack sent is an ack
    received, kill or not)."""
    rng = random.Random(seed)
    with FlatCakeStore.open(root, SMALL, w.config()) as store:
        ends: dict[int, int] = {}
        for s in range(base, base + SESSIONS_PER_ROOT):
            ends[s] = store.lookup(w.keys(s)).num_blocks
            if ends[s] < w.MAX_BLOCKS and len([e for e in ends.values()
                                               if e < w.MAX_BLOCKS]) >= ACTIVE:
                break
        while True:
            active = [s for s, e in ends.items() if e < w.MAX_BLOCKS]
            if len(active) < ACTIVE and max(ends) + 1 < base + SESSIONS_PER_ROOT:
                ends[max(ends) + 1] = 0
                continue
            if not active:
                return
            s = rng.choice(active)
            end = min(w.MAX_BLOCKS, ends[s] + rng.randint(1, 6))
            if w.store_turn(store, s, end):
                conn.send((s, end))
                ends[s] = end


def _drain(conn: Connection, acked: dict[int, list[int]]) -> None:
    while True:
        try:
            if not conn.poll():
                return
            s, end = conn.recv()
        except (EOFError, OSError):
            return
        acked[s].append(end)


def run_kills(base: Path, kills: int, seed: int) -> w.Verdict:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.robustness.workload", "tests.robustness.test_kill"])
    rng = random.Random(seed)
    verdict = w.Verdict()
    acked: defaultdict[int, list[int]] = defaultdict(list)
    root, first = base, 0
    for k in range(kills):
        if k % KILLS_PER_ROOT == 0:
            root = base / f"root-{k // KILLS_PER_ROOT}"
            first = seed * 100_000 + k * SESSIONS_PER_ROOT
            acked = defaultdict(list)
        recv, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=writer, args=(str(root), first, rng.randrange(1 << 30),
                                                 send))
        child.start()
        send.close()
        deadline = time.monotonic() + rng.uniform(0.0, 0.3)
        while time.monotonic() < deadline and child.is_alive():
            _drain(recv, acked)
            time.sleep(0.002)
        if child.pid is not None and child.is_alive():
            os.kill(child.pid, signal.SIGKILL)
            verdict.kills += 1
        child.join()
        _drain(recv, acked)
        recv.close()
        with FlatCakeStore.open(root, SMALL, w.config()) as store:
            before = verdict.restored_turns + verdict.reported_lost_turns
            # Every session a writer may have touched: acknowledged or not, what is
            # served must be right.
            for s in range(first, max(acked, default=first) + ACTIVE + 1):
                w.verify(store, s, acked[s], verdict, reported=False)
            store.control.check_integrity()
            on_disk, files = w.disk_bytes(root / "sessions")
            # The bar: the budget plus a 4 KiB block per file (ext4 spends one on an
            # extent tree once a file has more than four extents); the books count
            # the headers already, so this is stricter.
            if on_disk > store.control.ssd_used_bytes + 4096 * files:
                verdict.notes.append(f"kill {k}: {on_disk} B on disk in {files} files, "
                                     f"books {store.control.ssd_used_bytes} B")
            lost = verdict.reported_lost_turns
            if verdict.restored_turns + lost - before != sum(
                    len(v) for s, v in acked.items()):
                verdict.notes.append(f"kill {k}: bookkeeping mismatch")
        report = fsck_root(root)
        if not report.ok:
            verdict.notes.append(f"kill {k}: fsck found damage: {report.to_json()}")
    return verdict


def test_sigkill_loop(tmp_path: Path) -> None:
    verdict = run_kills(tmp_path, KILLS, seed=1)
    assert verdict.wrong_bytes == 0, verdict.notes
    assert verdict.unreported_lost_turns == 0, verdict.notes
    # A kill keeps the page cache: nothing acknowledged may even be reported lost.
    assert verdict.reported_lost_turns == 0, verdict.notes
    assert verdict.restored_turns == verdict.acknowledged_turns > 0
    assert verdict.kills >= KILLS * 0.9  # the child was alive (opening or writing)
    assert not verdict.notes, verdict.notes


if __name__ == "__main__":  # a long run: python -m tests.robustness.test_kill [kills]
    import sys
    import tempfile

    n = int(sys.argv[1]) if len(sys.argv) > 1 else KILLS
    with tempfile.TemporaryDirectory(prefix="flatcake-kill-") as tmp:
        t0 = time.process_time()
        v = run_kills(Path(tmp), n, seed=int(time.time()) % 1000)
        print({"runs": n, **{k: getattr(v, k) for k in (
            "kills", "sessions", "acknowledged_turns", "restored_turns", "reported_lost_turns",
            "unreported_lost_turns", "wrong_bytes")}, "notes": v.notes[:5],
            "parent_cpu_s": round(time.process_time() - t0, 1)})
