"""Read-only views of a store root on disk: ``inspect_root`` (what is stored, fast:
headers only) and ``fsck_root`` (every checksum). Neither needs the store to be open,
and neither takes its lock, so both work on a root another process is serving
(``FlatCakeStore.fsck`` holds writes off while it runs).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flatcake import progress
from flatcake.cio.filescan import DamagedSegment, scan_session_file
from flatcake.cio.format import FormatError
from flatcake.cio.hugepages import huge_pages_note
from flatcake.cio.names import QUARANTINE_DIR, SESSIONS_DIR, session_files_in
from flatcake.config import FlatCakeConfig
from flatcake.store.record import read_record


class NotAStore(ValueError):
    """A path given as a store root that holds no store."""


@dataclass(frozen=True, slots=True)
class FileCheck:
    """One session file's verdict.

    Attributes:
        path: the file.
        file_id: from its name.
        session_id: from its header (``None`` when the header is unreadable).
        num_segments: valid segments.
        num_blocks: blocks in valid segments.
        size_bytes: the file's size on disk (preallocation included).
        segment_bytes: bytes of valid segments (+ the file header).
        damaged: where the scan stopped, if it did.
        error: why the file header is unreadable ("" if it is fine).
        quarantined: the store already pulled the file out of service.
    """

    path: str
    file_id: int
    session_id: str | None
    num_segments: int
    num_blocks: int
    size_bytes: int
    segment_bytes: int
    damaged: tuple[DamagedSegment, ...]
    error: str
    quarantined: bool

    @property
    def ok(self) -> bool:
        return not self.damaged and not self.error and not self.quarantined


@dataclass(frozen=True, slots=True)
class FsckReport:
    """Every file under a root, checked."""

    root: str
    files: tuple[FileCheck, ...]

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.files)

    @property
    def num_damaged(self) -> int:
        return sum(1 for f in self.files if not f.ok)

    def to_json(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "ok": self.ok,
            "files": [
                {"path": f.path, "file_id": f.file_id, "session_id": f.session_id,
                 "segments": f.num_segments, "blocks": f.num_blocks, "ok": f.ok,
                 "quarantined": f.quarantined, "error": f.error,
                 "damaged": [{"file_offset": d.file_offset, "seq": d.seq, "reason": d.reason}
                             for d in f.damaged]}
                for f in self.files
            ],
        }


def _check_file(file_id: int, path: Path, verify_data: bool, quarantined: bool) -> FileCheck:
    size = path.stat().st_size
    try:
        header, ok, damaged = scan_session_file(path, verify_data=verify_data)
    except (FormatError, OSError) as exc:
        return FileCheck(str(path), file_id, None, 0, 0, size, 0, (), str(exc), quarantined)
    seg_bytes = 4096 + sum(s.header.layout.total_bytes for s in ok)
    return FileCheck(str(path), file_id, header.session_id, len(ok),
                     sum(s.header.num_blocks for s in ok), size, seg_bytes, tuple(damaged),
                     "", quarantined)


def check_root(root: str | os.PathLike[str], verify_data: bool) -> FsckReport:
    """Scan every session file (live and quarantined) under ``root``."""
    root_path = Path(root)
    if not root_path.exists():
        raise FileNotFoundError(f"store root {root_path} does not exist")
    if not root_path.is_dir() or not (root_path / SESSIONS_DIR).is_dir():
        raise NotAStore(f"{root_path} is not a FlatCake store (no {SESSIONS_DIR}/ "
                        f"directory in it)")
    todo = [(fid, p, False) for fid, p in session_files_in(root_path / SESSIONS_DIR)]
    todo += [(fid, p, True) for fid, p in session_files_in(root_path / QUARANTINE_DIR)]
    files = [_check_file(fid, p, verify_data, quarantined) for fid, p, quarantined in
             progress.track(todo, "fsck" if verify_data else "scan", unit="file")]
    return FsckReport(str(root_path), tuple(files))


def fsck_root(root: str | os.PathLike[str]) -> FsckReport:
    """Verify every header and data checksum under ``root``."""
    return check_root(root, verify_data=True)


def inspect_root(root: str | os.PathLike[str],
                 config: FlatCakeConfig | None = None) -> dict[str, Any]:
    """What ``root`` holds on SSD, per session, against the budgets and watermarks of
    ``config``, or by default of the config the store recorded when it last opened
    (``store.record``; defaults when there is none). Headers only; host memory is not
    persistent, so it is empty here."""
    report = check_root(root, verify_data=False)
    record = read_record(root) if config is None else None
    source = ("given" if config is not None else
              f"recorded by the store at {record.opened_at}" if record else
              "defaults (the store recorded no config)")
    if config is None:
        config = record.config if record else FlatCakeConfig()
    sessions: dict[str, dict[str, Any]] = {}
    used = 0
    for f in report.files:
        if f.quarantined or f.session_id is None:
            continue
        s = sessions.setdefault(f.session_id, {"session_id": f.session_id, "files": [],
                                               "segments": 0, "blocks": 0, "ssd_bytes": 0})
        s["files"].append(f.file_id)
        s["segments"] += f.num_segments
        s["blocks"] += f.num_blocks
        s["ssd_bytes"] += f.segment_bytes
        used += f.segment_bytes
    st, rc = config.store, config.reclaim
    return {
        "root": report.root,
        "config_source": source,
        "config": dataclasses.asdict(config),
        "geometry": dataclasses.asdict(record.geometry) if record else None,
        "io_mode": record.io_mode if record else None,
        "host_buffers": huge_pages_note(),
        "media": {
            "memory": {"used_bytes": 0, "capacity_bytes": st.memory_capacity_bytes,
                       "high": rc.memory_high, "low": rc.memory_low},
            "ssd": {"used_bytes": used, "capacity_bytes": st.ssd_capacity_bytes,
                    "high": rc.ssd_high, "low": rc.ssd_low,
                    "high_bytes": int(rc.ssd_high * st.ssd_capacity_bytes),
                    "low_bytes": int(rc.ssd_low * st.ssd_capacity_bytes),
                    "files": sum(1 for f in report.files if not f.quarantined),
                    "file_bytes_on_disk": sum(f.size_bytes for f in report.files)},
        },
        "sessions": sorted(sessions.values(), key=lambda s: s["session_id"]),
        "damaged_files": [f.path for f in report.files if not f.ok],
    }
