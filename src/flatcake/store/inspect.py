"""Read-only views of a store root on disk: ``inspect_root`` (what is stored, fast:
headers only) and ``fsck_root`` (every checksum). Neither needs the store to be open,
and neither takes its lock, so both work on a root another process is serving
(``FlatCakeStore.fsck`` holds writes off while it runs).

Settled and unsettled damage. The store settles damage the same way at open, while
serving and in ``flatcake fsck --repair`` (``store.recovery``); fsck only reads the disk
(no record of past repairs is kept), so "settled" is what the disk shows now: the store
has already done to that damage what it does, and neither a restart nor ``--repair``
would change anything::

    damage                          settled when                  fsck reports it as
    file header unreadable, or a    the file is in quarantine/    settled: quarantined,
    stray (its header names         (never read again, kept for   out of service (delete
    another file id)                inspection)                   it by hand when done)
    anything else in quarantine/    always, as above              settled, as above
    damaged segment (crc, torn,     the file is cut before it,    ok: a cut leaves no
    zeroed header page, zeros or    i.e. ends where its last      trace (below); deleted
    garbage at the end)             valid segment ends            files are simply gone
    segment damage in sessions/     not yet                       DAMAGED: --repair cuts
      (also a file the store could                                the file (deletes it if
      only scrub, not truncate)                                   no segment is valid)
    header unreadable or a stray    not yet                       DAMAGED: --repair moves
      in sessions/                                                it to quarantine/

A cut leaves no trace: the file then ends where its last valid segment ends, exactly
like a file that never had the later turns (an append log without a commit record
cannot tell), so fsck counts a cut file as ok; what was cut is in the store's
``RecoveryReport`` and log, and in ``repair_root``'s report. Files of another geometry
or span are the store's call at open (it quarantines them there); fsck checks their
checksums like any other's.

``FsckReport.ok`` (fsck's exit status 0): no live file holds damage that is not settled.
``FsckReport.clean``: nothing damaged at all, settled or not (quarantine/ empty too).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from flatcake import progress
from flatcake.cio.filescan import DamagedSegment, scan_session_file
from flatcake.cio.format import FormatError
from flatcake.cio.hugepages import huge_pages_note
from flatcake.cio.names import QUARANTINE_DIR, SESSIONS_DIR, session_files_in
from flatcake.config import FlatCakeConfig
from flatcake.geometry import KVGeometry
from flatcake.store.record import read_record

FileState = Literal["ok", "settled", "damaged"]


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
        stray: why the file is not the one its name says ("" if it is): its header
            names another file id.
        layer_bytes: data bytes of each layer in valid segments, as written (a
            sliding-window layer holds its window's blocks only).
        released_bytes: of ``layer_bytes``, the window rows a newer turn released
            (punched out of the file: ``control.releases``), per layer.
        allocated_bytes: what the file takes on disk (``st_blocks``: punched pages
            are not counted).
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
    stray: str = ""
    layer_bytes: tuple[int, ...] = ()
    released_bytes: tuple[int, ...] = ()
    allocated_bytes: int = 0

    @property
    def ok(self) -> bool:
        """A clean live file."""
        return not (self.damaged or self.error or self.stray or self.quarantined)

    @property
    def settled(self) -> bool:
        """Out of service already (in quarantine/), whatever it holds."""
        return self.quarantined

    @property
    def needs_repair(self) -> bool:
        """A live file holding damage not settled yet (a restart or ``--repair`` would)."""
        return not self.quarantined and bool(self.damaged or self.error or self.stray)

    @property
    def state(self) -> FileState:
        return "settled" if self.settled else "damaged" if self.needs_repair else "ok"

    @property
    def problem(self) -> str:
        """What is wrong with the file, in words ("" for a clean live file)."""
        if self.error:
            return f"file header damaged: {self.error}"
        if self.stray:
            return f"a stray: {self.stray}"
        if self.damaged:
            return "; ".join(f"segment at offset {d.file_offset}: {d.reason}"
                             for d in self.damaged) + (
                f" ({self.num_segments} valid segments before it)")
        return "pulled out of service by the store" if self.quarantined else ""

    @property
    def action(self) -> str:
        """What settled the file (``"quarantined"``) or what ``--repair`` will do to it
        (``"quarantine"``, ``"cut"``, ``"delete"``); "" for a clean live file."""
        if self.quarantined:
            return "quarantined"
        if self.error or self.stray:
            return "quarantine"
        if self.damaged:
            return "cut" if self.num_segments else "delete"
        return ""


@dataclass(frozen=True, slots=True)
class FsckReport:
    """Every file under a root, checked (live ones first, then quarantined ones)."""

    root: str
    files: tuple[FileCheck, ...]

    @property
    def ok(self) -> bool:
        """Nothing left to settle: no live file holds damage (fsck's exit status 0)."""
        return not any(f.needs_repair for f in self.files)

    @property
    def clean(self) -> bool:
        """No damage at all, settled or not: every file live and clean."""
        return all(f.ok for f in self.files)

    @property
    def num_ok(self) -> int:
        return sum(1 for f in self.files if f.state == "ok")

    @property
    def num_settled(self) -> int:
        return sum(1 for f in self.files if f.state == "settled")

    @property
    def num_damaged(self) -> int:
        """Live files holding damage not settled yet."""
        return sum(1 for f in self.files if f.state == "damaged")

    def to_json(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "ok": self.ok,
            "clean": self.clean,
            "num_files": len(self.files),
            "num_ok": self.num_ok,
            "num_settled": self.num_settled,
            "num_damaged": self.num_damaged,
            "files": [
                {"path": f.path, "file_id": f.file_id, "session_id": f.session_id,
                 "segments": f.num_segments, "blocks": f.num_blocks, "ok": f.ok,
                 "state": f.state, "settled": f.settled, "needs_repair": f.needs_repair,
                 "problem": f.problem, "action": f.action,
                 "quarantined": f.quarantined, "error": f.error, "stray": f.stray,
                 "damaged": [{"file_offset": d.file_offset, "seq": d.seq, "reason": d.reason,
                              "lost_segments": d.lost_segments} for d in f.damaged]}
                for f in self.files
            ],
        }


def _check_file(file_id: int, path: Path, verify_data: bool,
                quarantined: bool) -> FileCheck | None:
    """``None`` when the file is gone (a serving store deleted or moved it meanwhile)."""
    size = allocated = 0
    try:
        st = path.stat()
        size, allocated = st.st_size, st.st_blocks * 512
        header, ok, damaged = scan_session_file(path, verify_data=verify_data)
    except FileNotFoundError:
        return None
    except (FormatError, OSError) as exc:
        return FileCheck(str(path), file_id, None, 0, 0, size, 0, (), str(exc), quarantined)
    stray = "" if header.file_id == file_id else f"its header names file id {header.file_id}"
    seg_bytes = 4096 + sum(s.header.layout.total_bytes for s in ok)
    layer_bytes = tuple(sum(s.header.layout.layer_bytes(layer) for s in ok)
                        for layer in range(header.num_layers))
    released = tuple(sum(s.header.layout.layer_bytes(layer) for s in ok
                         if layer in s.released) for layer in range(header.num_layers))
    return FileCheck(str(path), file_id, header.session_id, len(ok),
                     sum(s.header.num_blocks for s in ok), size, seg_bytes, tuple(damaged),
                     "", quarantined, stray, layer_bytes, released, allocated)


def _layer_kinds(g: KVGeometry, files: Sequence[FileCheck]) -> list[dict[str, Any]]:
    """Per layer kind: SSD data bytes held, saved against storing every block (a
    sliding-window kind writes its window's blocks only), and released since (older
    turns' windows punched out of their files)."""
    live = [f for f in files if not f.quarantined and len(f.layer_bytes) == g.num_layers]
    written = g.kind_bytes([sum(f.layer_bytes[k] for f in live) for k in range(g.num_layers)])
    gone = g.kind_bytes([sum(f.released_bytes[k] for f in live if f.released_bytes)
                         for k in range(g.num_layers)])
    blocks = sum(f.num_blocks for f in live)
    whole = g.kind_bytes([blocks * b for b in g.layer_block_bytes])
    return [{"kind": kind, "stored_bytes": written[kind] - gone[kind],
             "saved_bytes": whole[kind] - written[kind], "released_bytes": gone[kind]}
            for kind in written]


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
    checks = [_check_file(fid, p, verify_data, quarantined) for fid, p, quarantined in
              progress.track(todo, "fsck" if verify_data else "scan", unit="file")]
    return FsckReport(str(root_path), tuple(c for c in checks if c is not None))


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
    geometry = record.geometry if record else None
    return {
        "root": report.root,
        "config_source": source,
        "config": dataclasses.asdict(config),
        "geometry": geometry.to_record() if geometry else None,
        "layer_kinds": _layer_kinds(geometry, report.files) if geometry else [],
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
                    "file_bytes_on_disk": sum(f.size_bytes for f in report.files),
                    "file_bytes_allocated": sum(f.allocated_bytes for f in report.files)},
        },
        "sessions": sorted(sessions.values(), key=lambda s: s["session_id"]),
        # Headers only: segment data crcs are fsck's; quarantined files are settled.
        "damaged_files": [f.path for f in report.files if f.needs_repair],
        "quarantined_files": [f.path for f in report.files if f.quarantined],
    }
