"""Restart recovery and offline repair of a store root: what a crash, a torn write or
corruption left on disk, settled the same way by ``FlatCakeStore.open`` and by
``flatcake fsck --repair``.

Per session file (``cio.format.scan_session_file`` tells a clean end from damage)::

    header unreadable, or a stray (names another file id, geometry, span)
                                        -> moved to quarantine/, counted
    valid segments, then damage         -> cut after the last valid one, the damage
                                           and the valid segments found past it counted
    no valid segment left               -> deleted (only a header was there)
    longer than its last segment        -> trimmed (a write a crash interrupted)
    .<name>.tmp                         -> removed (a crash while creating a file)

``recover_root`` also re-indexes every kept segment in the control plane; a segment
the books refuse (e.g. a key repeated inside it, written by an older version) is
damage like any other. Only a root where *no* file matches the geometry is refused:
the store was opened with the wrong model, and nothing is touched.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from flatcake.cio.files import SESSIONS_DIR, SessionFiles, session_files_in
from flatcake.cio.format import (
    DamagedSegment,
    FileHeader,
    FormatError,
    ScannedSegment,
    scan_session_file,
)
from flatcake.control import ControlPlane
from flatcake.store.inspect import NotAStore
from flatcake.store.results import RecoveryReport

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Scan:
    file_id: int
    path: Path
    header: FileHeader
    ok: list[ScannedSegment]
    bad: list[DamagedSegment]


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
              quarantined: list[int]) -> tuple[list[tuple[int, Path]], list[_Scan]]:
    found = session_files_in(files.sessions_dir)
    scans = []
    for file_id, path in found:
        try:
            scans.append(_Scan(file_id, path, *scan_session_file(path, verify_data)))
        except FormatError as exc:
            _quarantine(files, path, f"unreadable ({exc})", quarantined, file_id)
    return found, scans


def _quarantine(files: SessionFiles, path: Path, why: str, quarantined: list[int],
                file_id: int) -> None:
    dest = files.quarantine_path(path)
    logger.warning("session file %s is %s; moved to %s", path, why, dest)
    quarantined.append(file_id)


def _stray(files: SessionFiles, scan: _Scan, quarantined: list[int]) -> None:
    h = scan.header
    _quarantine(files, scan.path, f"a stray: its header names file id {h.file_id}, "
                f"{h.num_layers} layers x {h.block_bytes_per_layer} B, span "
                f"{h.span_bytes}", quarantined, scan.file_id)


def _settle(files: SessionFiles, scan: _Scan, kept: list[ScannedSegment],
            damaged: bool) -> bool:
    """Keep the file up to its last kept segment (trimmed), or delete it when nothing
    is kept. Returns whether it is kept."""
    if not kept:
        scan.path.unlink(missing_ok=True)
        return False
    files.adopt(scan.path, scan.header, kept[-1].end_offset, kept[-1].header.seq + 1,
                cut=damaged)
    return True


def recover_root(files: SessionFiles, control: ControlPlane, verify_data: bool,
                 crcs: dict[int, tuple[int, ...]]) -> RecoveryReport:
    """Settle every session file of a locked root and re-index what is kept in
    ``control``; ``crcs`` receives each re-indexed segment's layer crcs."""
    g, span = control.geometry, control.config.store.session_file_bytes
    for file_id, _ in [*session_files_in(files.sessions_dir),
                       *session_files_in(files.quarantine_dir)]:
        control.ssd.reserve_file_id(file_id)  # never hand out an id that is on disk
    quarantined: list[int] = []
    damaged_ids: list[int] = []
    found, scans = _scan_all(files, verify_data, quarantined)

    def fits(h: FileHeader) -> bool:
        return (h.num_layers, h.block_bytes_per_layer, h.span_bytes) == (
            g.num_layers, g.block_bytes_per_layer, span)

    if scans and not any(fits(s.header) for s in scans):
        h, path = scans[0].header, scans[0].path
        if h.span_bytes != span:
            raise ValueError(f"store.session_file_bytes={span} but session file {path} "
                             f"was written with span {h.span_bytes}")
        raise ValueError(
            f"session file {path} holds {h.num_layers} layers x {h.block_bytes_per_layer} "
            f"B blocks, but geometry {g.name!r} has {g.num_layers} x "
            f"{g.block_bytes_per_layer} B")
    segments = blocks = damaged = lost = 0
    sessions: set[str] = set()
    wall_now, clock_now = time.time(), control.clock.now()
    for scan in scans:
        header, bad = scan.header, scan.bad
        if header.file_id != scan.file_id or not fits(header):
            _stray(files, scan, quarantined)
            continue
        last_access = clock_now - max(0.0, wall_now - scan.path.stat().st_mtime)
        kept: list[ScannedSegment] = []
        for scanned in scan.ok:
            sh = scanned.header
            try:
                seg = control.recover_segment(
                    header.session_id, scan.file_id, scanned.file_offset, sh.layout,
                    sh.keys, sh.turn_index, virtual_base=header.virtual_base,
                    last_access=last_access)
            except ValueError as exc:  # the books refuse it (e.g. a repeated key)
                bad = [DamagedSegment(scanned.file_offset, f"refused: {exc}", sh.seq,
                                      len(scan.ok) - len(kept) - 1)]
                logger.warning("session file %s: segment at %d %s; cut there", scan.path,
                               scanned.file_offset, bad[0].reason)
                break
            crcs[seg.segment_id] = sh.layer_crcs
            kept.append(scanned)
            blocks += sh.num_blocks
        segments += len(kept)
        damaged += len(bad)
        lost += sum(d.lost_segments for d in bad)
        if bad:
            damaged_ids.append(scan.file_id)
        if _settle(files, scan, kept, bool(bad)):
            sessions.add(header.session_id)
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
            if not _settle(files, scan, scan.ok, bool(scan.bad)):
                deleted += 1
            elif trimmed:
                cut += 1
    finally:
        files.close()
    return RepairReport(str(root_path), len(found), len(quarantined), cut, deleted,
                        damaged, lost)
