"""Restart scan of a store directory: read every session file's headers (no torch, no
writes) and re-index the valid segments in the books.

One scan serves every host: ``store.recovery.recover_root`` (scan, index, then settle the
files), the vLLM scheduler half (scan and index only: its worker settles the files) and
the worker half (scan, then adopt the files in its executor)::

    scan_sessions   (file_id, path) of every session file -> FileScan per readable
                    file (valid segments, then damage), the unreadable ones apart
    check_fit       no file matches the geometry -> ValueError (wrong model or span)
    index_scan      control.recover_segment for each valid segment, in file order;
                    one the books refuse (a key repeated inside it) is damage there
    index_sessions  all of it for a host that only keeps books (the vLLM scheduler)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from flatcake.cio.filescan import DamagedSegment, ScannedSegment, scan_session_file
from flatcake.cio.format import FileHeader, FormatError
from flatcake.cio.names import session_files_in
from flatcake.control.plane import ControlPlane
from flatcake.geometry import KVGeometry

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FileScan:
    """One readable session file: its header, valid segments, then the damage."""

    file_id: int
    path: Path
    header: FileHeader
    ok: list[ScannedSegment]
    bad: list[DamagedSegment]


@dataclass(frozen=True, slots=True)
class ScanResult:
    """Every session file of a directory: ``found`` (file_id, path), the readable
    ``scans``, and the ``unreadable`` ones (file_id, path, why)."""

    found: list[tuple[int, Path]]
    scans: list[FileScan]
    unreadable: list[tuple[int, Path, FormatError]]


def scan_sessions(sessions_dir: Path, verify_data: bool) -> ScanResult:
    """Read the headers (and with ``verify_data`` every data crc) of every file."""
    found = session_files_in(sessions_dir)
    scans, unreadable = [], []
    for file_id, path in found:
        try:
            scans.append(FileScan(file_id, path, *scan_session_file(path, verify_data)))
        except FormatError as exc:
            unreadable.append((file_id, path, exc))
    return ScanResult(found, scans, unreadable)


def fits(header: FileHeader, geometry: KVGeometry, span_bytes: int) -> bool:
    """The file holds blocks of ``geometry`` in files of ``span_bytes``."""
    return (header.num_layers, header.block_bytes_per_layer, header.span_bytes) == (
        geometry.num_layers, geometry.block_bytes_per_layer, span_bytes)


def check_fit(scans: list[FileScan], geometry: KVGeometry, span_bytes: int) -> None:
    """Refuse a directory where no file matches the geometry (the store was opened
    with the wrong model or file span): nothing there is touched."""
    if not scans or any(fits(s.header, geometry, span_bytes) for s in scans):
        return
    h, path = scans[0].header, scans[0].path
    if h.span_bytes != span_bytes:
        raise ValueError(f"store.session_file_bytes={span_bytes} but session file {path} "
                         f"was written with span {h.span_bytes}")
    raise ValueError(
        f"session file {path} holds {h.num_layers} layers x {h.block_bytes_per_layer} "
        f"B blocks, but geometry {geometry.name!r} has {geometry.num_layers} x "
        f"{geometry.block_bytes_per_layer} B")


def is_stray(scan: FileScan, geometry: KVGeometry, span_bytes: int) -> bool:
    """The file names another file id, or another geometry or span: not served."""
    return scan.header.file_id != scan.file_id or not fits(scan.header, geometry, span_bytes)


def index_scan(control: ControlPlane, scan: FileScan, wall_now: float | None = None
               ) -> tuple[int, list[DamagedSegment]]:
    """Re-index the valid segments of ``scan`` in file order; returns how many were
    kept and the damage (the scanned damage, or the segment the books refused, which
    cuts the file there). The session's last access is the file's modification time."""
    header = scan.header
    age_s = max(0.0, (time.time() if wall_now is None else wall_now)
                - scan.path.stat().st_mtime)
    last_access = control.clock.now() - age_s
    for kept, scanned in enumerate(scan.ok):
        sh = scanned.header
        try:
            control.recover_segment(
                header.session_id, scan.file_id, scanned.file_offset, sh.layout, sh.keys,
                sh.turn_index, virtual_base=header.virtual_base, last_access=last_access)
        except ValueError as exc:  # the books refuse it (e.g. a repeated key)
            bad = DamagedSegment(scanned.file_offset, f"refused: {exc}", sh.seq,
                                 len(scan.ok) - kept - 1)
            logger.warning("session file %s: segment at %d %s; cut there", scan.path,
                           scanned.file_offset, bad.reason)
            return kept, [bad]
    return len(scan.ok), scan.bad


def index_sessions(control: ControlPlane, sessions_dir: Path) -> int:
    """Re-index every valid segment under ``sessions_dir`` without touching a file
    (headers only: data crcs are checked on every load). Unreadable files and strays
    are not served. Returns the segments indexed."""
    g, span = control.geometry, control.config.store.session_file_bytes
    found = scan_sessions(sessions_dir, verify_data=False)
    for file_id, _ in found.found:
        control.ssd.reserve_file_id(file_id)  # even an empty file keeps its id
    for _file_id, path, exc in found.unreadable:
        logger.warning("session file %s is unreadable (%s); not served", path, exc)
    check_fit(found.scans, g, span)
    wall_now = time.time()
    count = 0
    for scan in found.scans:
        if is_stray(scan, g, span):
            logger.warning("session file %s is a stray; not served", scan.path)
            continue
        count += index_scan(control, scan, wall_now)[0]
    if count:
        logger.info("FlatCake recovered %d segments from %s", count, sessions_dir)
    return count
