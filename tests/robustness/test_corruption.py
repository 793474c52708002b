"""Random corruption of a store at rest (what a power cut, a bad sector or an operator
leaves): byte flips anywhere, zeroed 4 KiB pages, zeroed ranges, truncations at random
offsets. After each: no wrong byte is served, every acknowledged turn is restored or
reported damaged (by the restart's ``RecoveryReport`` or by the load), the store
reopens, and once it has served every session ``fsck`` finds its live files clean.

One corruption is out of reach by design: a truncation exactly at a segment boundary
leaves a file indistinguishable from one that never had the later turns (an append log
without an external commit record cannot tell). Such trials are counted apart and
checked for wrong bytes only.

``FLATCAKE_ROBUSTNESS_CORRUPTIONS`` sets the number of trials (default 100).
"""

from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path

from flatcake.store import FlatCakeStore, fsck_root
from tests.robustness import workload as w
from tests.robustness.helpers import CONFIG, TURNS, build, corrupt
from tests.store.helpers import SMALL

TRIALS = int(os.environ.get("FLATCAKE_ROBUSTNESS_CORRUPTIONS", "100"))


def run_trials(base: Path, trials: int, seed: int) -> tuple[w.Verdict, int]:
    rng = random.Random(seed)
    pristine = base / "pristine"
    acked = build(pristine)
    with FlatCakeStore.open(pristine, SMALL, w.config(*CONFIG)) as store:
        files_of = {s: set(store.control.files_of(w.session_name(s))) for s in TURNS}
    verdict = w.Verdict()
    boundary = 0
    for t in range(trials):
        trial = base / f"trial-{t}"
        shutil.copytree(pristine, trial)
        what, at_boundary = corrupt(trial, rng)
        boundary += at_boundary
        fsck_before = fsck_root(trial)
        lost_before = verdict.reported_lost_turns + verdict.unreported_lost_turns
        with FlatCakeStore.open(trial, SMALL, w.config(*CONFIG)) as store:
            damaged = set(store.recovery.damaged_file_ids)
            for s in TURNS:
                probe = w.Verdict() if at_boundary else verdict
                w.verify(store, s, acked[s], probe, reported=bool(files_of[s] & damaged))
                verdict.wrong_bytes += probe.wrong_bytes if probe is not verdict else 0
                if probe is not verdict:
                    verdict.notes += [n for n in probe.notes if "wrong" in n]
            store.control.check_integrity()
        lost = verdict.reported_lost_turns + verdict.unreported_lost_turns - lost_before
        if lost and fsck_before.ok:
            verdict.notes.append(f"trial {t} ({what}): turns lost but fsck said ok")
        after = fsck_root(trial)
        if not all(f.ok for f in after.files if not f.quarantined):
            verdict.notes.append(f"trial {t} ({what}): live files still damaged after "
                                 f"serving: {after.to_json()}")
        verdict.notes = [n if "[trial" in n else f"{n} [trial {t}: {what}]"
                         for n in verdict.notes]
        shutil.rmtree(trial)
    return verdict, boundary


def test_random_corruptions(tmp_path: Path) -> None:
    verdict, _ = run_trials(tmp_path, TRIALS, seed=7)
    assert verdict.wrong_bytes == 0, verdict.notes
    assert verdict.unreported_lost_turns == 0, verdict.notes
    assert not verdict.notes, verdict.notes
    assert verdict.reported_lost_turns > 0  # the corruptions did hit turns


if __name__ == "__main__":  # a long run: python -m tests.robustness.test_corruption [n]
    import sys
    import tempfile

    n = int(sys.argv[1]) if len(sys.argv) > 1 else TRIALS
    with tempfile.TemporaryDirectory(prefix="flatcake-corrupt-") as tmp:
        t0 = time.process_time()
        v, b = run_trials(Path(tmp), n, seed=int(time.time()) % 1000)
        print({"trials": n, "boundary_truncations": b, **{k: getattr(v, k) for k in (
            "sessions", "acknowledged_turns", "restored_turns", "reported_lost_turns",
            "unreported_lost_turns", "wrong_bytes")}, "notes": v.notes[:8],
            "cpu_s": round(time.process_time() - t0, 1)})
