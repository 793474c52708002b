"""The books' restart decision (``ControlPlane.recover_files``, pure) against the store's
open path on the same damaged roots: equal counts, equal damaged file ids, and every
file kept, cut, deleted or quarantined as its verdict says. This ties the pure
function to the I/O that acts on it, so a host can switch to it without a change in
behaviour."""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

from flatcake.cio.files import SESSIONS_DIR, session_files_in
from flatcake.cio.filescan import scan_session_file
from flatcake.cio.format import FormatError
from flatcake.control import ControlPlane, FileFate, ScannedFile
from flatcake.store import FlatCakeStore
from tests.robustness import workload as w
from tests.robustness.helpers import CONFIG, build, corrupt
from tests.store.helpers import SMALL


def scan_root(root: Path) -> list[ScannedFile]:
    out = []
    now = time.time()
    for file_id, path in session_files_in(root / SESSIONS_DIR):
        age = max(0.0, now - path.stat().st_mtime)
        try:
            header, ok, bad = scan_session_file(path, verify_data=False)
        except FormatError as exc:
            out.append(ScannedFile(file_id, None, age_s=age, name=str(path), error=str(exc)))
            continue
        out.append(ScannedFile(file_id, header, ok, bad, age, str(path)))
    return out


def test_verdicts_match_the_open_path(tmp_path: Path) -> None:
    rng = random.Random(11)
    fates: set[tuple[FileFate, bool]] = set()
    pristine = tmp_path / "pristine"
    build(pristine)
    for trial in range(6):
        root = tmp_path / f"t{trial}"
        shutil.copytree(pristine, root)
        for _ in range(1 + trial % 3):
            corrupt(root, rng)
        scans = scan_root(root)
        books = ControlPlane(SMALL, w.config(*CONFIG))
        rec = books.recover_files(scans)
        with FlatCakeStore.open(root, SMALL, w.config(*CONFIG)) as store:
            report = store.recovery
        assert (report.num_files, report.num_sessions, report.num_segments,
                report.num_blocks, report.damaged_segments, report.damaged_files,
                report.lost_segments, report.damaged_file_ids) == (
            rec.num_files, rec.num_sessions, rec.num_segments, rec.num_blocks,
            rec.num_damaged, rec.num_quarantined, rec.num_lost, rec.damaged_file_ids)
        on_disk = dict(session_files_in(root / SESSIONS_DIR))
        for v in rec.files:
            fates.add((v.fate, v.cut))
            if v.fate == FileFate.KEEP:
                assert on_disk[v.file_id].stat().st_size == v.end_bytes
            else:
                assert v.file_id not in on_disk
    # The trials reached every verdict: clean, cut, deleted, quarantined.
    assert fates >= {(FileFate.KEEP, False), (FileFate.KEEP, True)}
    assert fates & {(FileFate.DELETE, False), (FileFate.QUARANTINE, False)}
