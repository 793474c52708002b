"""Restart recovery and offline repair of a store root: what a crash, a torn write or
corruption left on disk, settled the same way by ``FlatCakeStore.open`` and by
``flatcake fsck --repair``.

Per session file (``cio.filescan.scan_session_file`` tells a clean end from damage)::

    header unreadable, or a stray (names another file id, geometry, span)
                                        -> moved to quarantine/, counted
    valid segments, then damage         -> cut after the last valid one, the damage
                                           and the valid segments found past it counted
    no valid segment left               -> deleted (only a header was there)
    longer than its last segment        -> trimmed (a write a crash interrupted)
    .<name>.tmp                         -> removed (a crash while creating a file)

``recover_root`` also re-indexes every kept segment in the control plane (``cio.scan``,
the scan the vLLM connector uses too); a segment the books refuse (e.g. a key
repeated inside it, written by an older version) is damage like any other. Only a
root where *no* file matches the geometry is refused: the store was opened with the
wrong model, and nothing is touched.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flatcake.cio.files import SESSIONS_DIR, SessionFiles
from flatcake.cio.scan import recover_files, scan_sessions
from flatcake.control import ControlPlane
from flatcake.store.inspect import NotAStore
from flatcake.store.results import RecoveryReport

if TYPE_CHECKING:
    from flatcake.cio.executor import Executor

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RepairReport:
    """What ``repair_root`` did.

    Attributes:
        root: the store root.
        num_files: session files found.
        quarantined: files moved to quarantine (unreadable header, strays).
        cut: files cut after their last valid segment (damage or an interrupted write).
        deleted: files deleted (no valid segment).
        damaged_segments: damaged segments cut off.
        lost_segments: valid segments found past damage and cut off with it.
        quarantined_paths, cut_paths, deleted_paths: the files of each count, where
            they are now (quarantine/ for the quarantined ones).
    """

    root: str
    num_files: int
    quarantined: int
    cut: int
    deleted: int
    damaged_segments: int
    lost_segments: int
    quarantined_paths: tuple[str, ...] = ()
    cut_paths: tuple[str, ...] = ()
    deleted_paths: tuple[str, ...] = ()


def _quarantine(files: SessionFiles, path: Path, why: str, quarantined: list[str]) -> None:
    dest = files.quarantine_path(path, why)
    logger.warning("session file %s is %s; moved to %s", path, why, dest)
    quarantined.append(str(dest))


def recover_root(executor: Executor, control: ControlPlane,
                 verify_data: bool) -> RecoveryReport:
    """Re-index every session file of the executor's (locked) root in ``control``
    (``control.restart``, the decision every host takes), then settle the files on
    disk as the verdicts say and hand the kept ones (and their crcs) to the executor."""
    files = executor.files
    scan, rec = recover_files(control, files.sessions_dir, verify_data=verify_data,
                              other_dirs=(files.quarantine_dir,))
    executor.settle(scan, rec, control)
    report = RecoveryReport(rec.num_files, rec.num_sessions, rec.num_segments,
                            rec.num_blocks, rec.num_damaged, rec.num_quarantined,
                            rec.num_lost, rec.damaged_file_ids)
    if rec.num_files:
        logger.info("recovered %s", report)
    return report


def repair_root(root: str | os.PathLike[str]) -> RepairReport:
    """Offline ``fsck --repair``: settle every session file under ``root`` as a restart
    would (every data crc verified), so ``fsck`` then finds its live files clean.
    Takes the root's lock: refuses (``ValueError``) while a store serves it."""
    root_path = Path(root)
    if not root_path.exists():
        raise FileNotFoundError(f"store root {root_path} does not exist")
    if not (root_path / SESSIONS_DIR).is_dir():
        raise NotAStore(f"{root_path} is not a FlatCake store (no {SESSIONS_DIR}/ "
                        f"directory in it)")
    files = SessionFiles(root_path, "buffered")
    files.lock_root()  # also removes the temp files a crash left
    try:
        quarantined: list[str] = []
        cut: list[str] = []
        deleted: list[str] = []
        scan = scan_sessions(files.sessions_dir, True)
        damaged = lost = 0
        for f in scan.files:
            path = scan.paths[f.file_id]
            header = scan.headers.get(f.file_id)
            if header is None:
                _quarantine(files, path, f"unreadable ({f.error})", quarantined)
                continue
            if header.file_id != f.file_id:
                _quarantine(files, path, f"a stray: its header names file id "
                            f"{header.file_id}", quarantined)
                continue
            last = f.segments[-1] if f.segments else None
            trimmed = bool(f.damage) or path.stat().st_size > (
                last.end_offset if last is not None else 0)
            damaged += len(f.damage)
            lost += sum(d.lost_segments for d in f.damage)
            if last is None:
                path.unlink(missing_ok=True)
                if f.damage:
                    files.journal("delete", path, "damaged before its first segment")
                deleted.append(str(path))
                continue
            files.adopt(path, header, last.end_offset, cut=bool(f.damage))
            if trimmed:
                cut.append(str(path))
    finally:
        files.close()
    return RepairReport(str(root_path), len(scan.files), len(quarantined), len(cut),
                        len(deleted), damaged, lost, tuple(quarantined), tuple(cut),
                        tuple(deleted))
