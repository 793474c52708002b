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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flatcake.cio.files import SESSIONS_DIR, SessionFiles, session_files_in
from flatcake.cio.scan import FileScan, check_fit, index_scan, is_stray, scan_sessions
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
    """

    root: str
    num_files: int
    quarantined: int
    cut: int
    deleted: int
    damaged_segments: int
    lost_segments: int


def _scan_all(files: SessionFiles, verify_data: bool,
              quarantined: list[int]) -> tuple[list[tuple[int, Path]], list[FileScan]]:
    result = scan_sessions(files.sessions_dir, verify_data)
    for file_id, path, exc in result.unreadable:
        _quarantine(files, path, f"unreadable ({exc})", quarantined, file_id)
    return result.found, result.scans


def _quarantine(files: SessionFiles, path: Path, why: str, quarantined: list[int],
                file_id: int) -> None:
    dest = files.quarantine_path(path)
    logger.warning("session file %s is %s; moved to %s", path, why, dest)
    quarantined.append(file_id)


def _stray(files: SessionFiles, scan: FileScan, quarantined: list[int]) -> None:
    h = scan.header
    _quarantine(files, scan.path, f"a stray: its header names file id {h.file_id}, "
                f"{h.num_layers} layers x {h.block_bytes_per_layer} B, span "
                f"{h.span_bytes}", quarantined, scan.file_id)


def recover_root(executor: Executor, control: ControlPlane,
                 verify_data: bool) -> RecoveryReport:
    """Settle every session file of the executor's (locked) root, re-index what is kept
    in ``control``, and hand the kept files (and their crcs) to the executor."""
    files = executor.files
    g, span = control.geometry, control.config.store.session_file_bytes
    for file_id, _ in [*session_files_in(files.sessions_dir),
                       *session_files_in(files.quarantine_dir)]:
        control.ssd.reserve_file_id(file_id)  # never hand out an id that is on disk
    quarantined: list[int] = []
    damaged_ids: list[int] = []
    found, scans = _scan_all(files, verify_data, quarantined)
    check_fit(scans, g, span)
    segments = blocks = damaged = lost = 0
    sessions: set[str] = set()
    wall_now = time.time()
    for scan in scans:
        if is_stray(scan, g, span):
            _stray(files, scan, quarantined)
            continue
        kept, bad = index_scan(control, scan, wall_now)
        segments += kept
        blocks += sum(s.header.num_blocks for s in scan.ok[:kept])
        damaged += len(bad)
        lost += sum(d.lost_segments for d in bad)
        if bad:
            damaged_ids.append(scan.file_id)
        if not kept:
            scan.path.unlink(missing_ok=True)  # only a header was there
            continue
        executor.adopt(scan, kept, cut=bool(bad))
        sessions.add(scan.header.session_id)
    report = RecoveryReport(len(found), len(sessions), segments, blocks, damaged,
                            len(quarantined), lost,
                            tuple(sorted(damaged_ids + quarantined)))
    if found:
        logger.info("recovered %s", report)
    return report


def repair_root(root: str | os.PathLike[str]) -> RepairReport:
    """Offline ``fsck --repair``: settle every session file under ``root`` as a restart
    would (every data crc verified), so ``fsck`` then finds its live files clean.
    Takes the root's lock: refuses (``ValueError``) while a store serves it."""
    from flatcake.cio.executor import adopt_file

    root_path = Path(root)
    if not root_path.exists():
        raise FileNotFoundError(f"store root {root_path} does not exist")
    if not (root_path / SESSIONS_DIR).is_dir():
        raise NotAStore(f"{root_path} is not a FlatCake store (no {SESSIONS_DIR}/ "
                        f"directory in it)")
    files = SessionFiles(root_path, "buffered")
    files.lock_root()  # also removes the temp files a crash left
    try:
        quarantined: list[int] = []
        found, scans = _scan_all(files, True, quarantined)
        cut = deleted = damaged = lost = 0
        for scan in scans:
            if scan.header.file_id != scan.file_id:
                _stray(files, scan, quarantined)
                continue
            trimmed = bool(scan.bad) or scan.path.stat().st_size > (
                scan.ok[-1].end_offset if scan.ok else 0)
            damaged += len(scan.bad)
            lost += sum(d.lost_segments for d in scan.bad)
            if not scan.ok:
                scan.path.unlink(missing_ok=True)
                deleted += 1
                continue
            adopt_file(files, scan, len(scan.ok), bool(scan.bad))
            if trimmed:
                cut += 1
    finally:
        files.close()
    return RepairReport(str(root_path), len(found), len(quarantined), cut, deleted,
                        damaged, lost)
