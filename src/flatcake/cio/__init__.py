"""File I/O, the data plane: O_DIRECT readers and writer, the staging window, the
on-disk format, session files, the host arena, and the executor that runs the books'
tasks with them (``executor``; its loads: ``loads``).

Names resolve on first use (PEP 562), kept lazy for torch: most modules here import it
(1-2 s of CPU), and a plain face would load it with ``flatcake.cio.format`` /
``filescan`` / ``scan`` / ``names``, which stay free of it for the processes that only
keep books (the vLLM scheduler half) and the commands that read a store without moving
KV bytes (``flatcake fsck``, ``flatcake inspect``).
"""

from __future__ import annotations

from flatcake.lazy import lazy_getattr

_WHERE = {
    "ArenaBuffer": "arena",
    "DirectIOUnsupported": "direct",
    "aligned_buffer": "direct",
    "resolve_io_mode": "direct",
    "Executor": "executor",
    "LoadOutcome": "loads",
    "ReaderDispatch": "dispatch",
    "StoreOutcome": "executor",
    "SessionFiles": "files",
    "DamagedSegment": "filescan",
    "FileHeader": "format",
    "FormatError": "format",
    "ScannedSegment": "filescan",
    "SegmentHeader": "format",
    "scan_session_file": "filescan",
    "QUARANTINE_DIR": "names",
    "SESSIONS_DIR": "names",
    "session_files_in": "names",
    "PagedKV": "paged",
    "DirectReader": "readers",
    "GdsReader": "readers",
    "Reader": "readers",
    "ReadRequest": "readers",
    "DiskScan": "scan",
    "recover_files": "scan",
    "scan_sessions": "scan",
    "Fence": "restore",
    "LayerReady": "restore",
    "OpenFile": "restore",
    "RestoreJob": "restore",
    "RestoreOutcome": "restore",
    "StagingWindow": "staging",
    "SegmentWriter": "writer",
}

__all__ = sorted(_WHERE)


__getattr__ = lazy_getattr(__name__, _WHERE)
