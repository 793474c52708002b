"""Names under a store root, and the listing of its session files.

Kept apart from ``cio.files`` (which opens, grows and writes files, and needs torch for
aligned buffers) so read-only tools (``flatcake inspect`` / ``fsck``) start without it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from flatcake.cio.format import parse_session_file_name

SESSIONS_DIR = "sessions"
QUARANTINE_DIR = "quarantine"
LOCK_FILE = "LOCK"
# One JSON line per file the store cut, deleted or quarantined for damage (cio.files
# appends it; fsck lists it): a cut leaves a clean file, so this is its only trace.
DAMAGE_LOG = "damage.log"


def session_files_in(directory: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """``(file_id, path)`` of every session file in ``directory``, by file id."""
    d = Path(directory)
    if not d.is_dir():
        return []
    out = []
    for entry in d.iterdir():
        file_id = parse_session_file_name(entry.name)
        if file_id is not None and entry.is_file():
            out.append((file_id, entry))
    return sorted(out)


def read_damage_log(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The entries of ``ROOT/damage.log``, oldest first (a torn last line is skipped)."""
    try:
        text = (Path(root) / DAMAGE_LOG).read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out
