"""Restart scan of a store directory: read every session file's headers (no torch, no
writes) and hand them to the books' pure restart decision (``control.restart``).

One scan serves every host: ``store.recovery.recover_root`` (scan, decide, then settle
the files as the verdicts say), the vLLM scheduler half (scan and decide: the books
only) and the worker half (scan and decide on scratch books of its own, then settle the
files, so it keeps the same files and segments the scheduler half serves)::

    scan_sessions    (file_id, path) of every session file -> ScannedFile per file
                     (valid segments, then damage; header None when unreadable)
    recover_files    ControlPlane.recover_files: re-index, one FileVerdict per file
                     (keep / cut, delete, quarantine); refuses a wrong-model directory
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from flatcake.cio.filescan import scan_session_file
from flatcake.cio.format import FileHeader, FormatError
from flatcake.cio.names import session_files_in
from flatcake.control.plane import ControlPlane
from flatcake.control.recovery import Recovery, ScannedFile

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DiskScan:
    """Every session file of a directory as scanned, and where each one lives."""

    files: list[ScannedFile]
    paths: dict[int, Path]
    headers: dict[int, FileHeader]


def scan_sessions(sessions_dir: Path, verify_data: bool) -> DiskScan:
    """Read the headers (and with ``verify_data`` every data crc) of every file; a file
    gone meanwhile (another process settled it) is left out."""
    files: list[ScannedFile] = []
    paths: dict[int, Path] = {}
    headers: dict[int, FileHeader] = {}
    wall_now = time.time()
    for file_id, path in session_files_in(sessions_dir):
        try:
            try:
                header, ok, bad = scan_session_file(path, verify_data)
            except FormatError as exc:
                files.append(ScannedFile(file_id, None, name=str(path), error=str(exc)))
            else:
                age_s = max(0.0, wall_now - path.stat().st_mtime)
                files.append(ScannedFile(file_id, header, ok, bad, age_s, str(path)))
                headers[file_id] = header
        except FileNotFoundError:
            continue
        paths[file_id] = path
    return DiskScan(files, paths, headers)


def recover_files(control: ControlPlane, sessions_dir: Path, *, verify_data: bool = False,
                  other_dirs: tuple[Path, ...] = ()) -> tuple[DiskScan, Recovery]:
    """Scan ``sessions_dir`` and re-index it in ``control`` (the books' verdicts, not
    acted on yet). Files in ``other_dirs`` (quarantine) keep their ids reserved."""
    scan = scan_sessions(sessions_dir, verify_data)
    others = [fid for d in other_dirs for fid, _ in session_files_in(d)]
    recovery = control.recover_files(scan.files, other_file_ids=others)
    if recovery.num_segments:
        logger.info("recovered %d segments of %d sessions from %s", recovery.num_segments,
                    recovery.num_sessions, sessions_dir)
    return scan, recovery
