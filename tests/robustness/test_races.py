"""Writers, restores, reclaim and session drops racing across threads on a store whose
SSD budget is a fraction of what they write: no load ever returns a wrong byte, the
budget (and the bytes on disk) never exceed their bound, the books stay consistent,
and the store reopens with ``fsck`` clean."""

from __future__ import annotations

import contextlib
import random
import threading
from pathlib import Path

from flatcake.errors import CapacityError
from flatcake.store import FlatCakeStore, fsck_root
from tests.robustness import workload as w
from tests.store.helpers import SMALL, empty_kv

BUDGET = 1 << 20  # ~30 full sessions' worth of what the writers store
SESSIONS = list(range(700, 760))


def test_budget_reclaim_and_restores_race(tmp_path: Path) -> None:
    cfg = w.config(f"store.ssd_capacity_bytes={BUDGET}", "store.read_threads=2",
                   "scheduler.max_restores_in_flight=2")
    errors: list[str] = []
    bound_errors: list[str] = []
    stop = threading.Event()

    def guard(fn):  # type: ignore[no-untyped-def]
        def run(seed: int) -> None:
            try:
                fn(random.Random(seed))
            except BaseException as exc:  # a failed thread fails the test
                errors.append(f"{fn.__name__}: {exc!r}")
                stop.set()
        return run

    with FlatCakeStore.open(tmp_path, SMALL, cfg) as store:

        @guard
        def writer(rng: random.Random) -> None:
            for _ in range(150):
                s = rng.choice(SESSIONS)
                have = store.lookup(w.keys(s)).num_blocks
                end = min(w.MAX_BLOCKS, have + rng.randint(1, 8))
                # CapacityError: every session pinned at that moment, a documented refusal
                with contextlib.suppress(CapacityError):
                    w.store_turn(store, s, end)
                if stop.is_set():
                    return

        @guard
        def reader(rng: random.Random) -> None:
            for _ in range(200):
                s = rng.choice(SESSIONS)
                dst = empty_kv(SMALL, w.MAX_BLOCKS)
                res = store.load(w.keys(s), dst, range(w.MAX_BLOCKS))
                if not w.served_bytes_ok(dst, s, res.num_blocks):
                    errors.append(f"wrong bytes served for session {s}")
                if stop.is_set():
                    return

        @guard
        def reclaimer(rng: random.Random) -> None:
            while not stop.wait(0.002):
                if rng.random() < 0.5:
                    store.reclaim()
                else:
                    # unknown, or pinned by a restore or a write: refused
                    with contextlib.suppress(KeyError, ValueError):
                        store.drop_session(w.session_name(rng.choice(SESSIONS)))
                media = store.inspect()["media"]["ssd"]
                on_disk, files = w.disk_bytes(tmp_path / "sessions")
                if media["used_bytes"] > BUDGET:
                    bound_errors.append(f"SSD use {media['used_bytes']} > budget {BUDGET}")
                if on_disk > BUDGET + 4096 * (files + 2):  # +2: a file mid-creation
                    bound_errors.append(f"{on_disk} B on disk in {files} files")

        workers = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
        workers += [threading.Thread(target=reader, args=(10 + i,)) for i in range(2)]
        background = threading.Thread(target=reclaimer, args=(99,))
        background.start()
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        stop.set()
        background.join()
        store.control.check_integrity()
        stats = store.control.stats()
        assert stats.sessions_reclaimed_ssd > 0  # the budget really was contended
    assert not errors, errors
    assert not bound_errors, bound_errors[:5]
    verdict = w.Verdict()
    with FlatCakeStore.open(tmp_path, SMALL, cfg) as store:
        assert store.recovery.damaged_segments == 0
        for s in SESSIONS:
            w.verify(store, s, [], verdict, reported=False)
    assert verdict.wrong_bytes == 0, verdict.notes
    assert fsck_root(tmp_path).ok
