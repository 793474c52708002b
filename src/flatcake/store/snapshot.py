"""``FlatCakeStore.inspect``: a JSON-able snapshot of a live store's books."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flatcake.cio.readers import Reader
from flatcake.control import ControlPlane
from flatcake.store.results import RecoveryReport


def snapshot(root: Path, io_mode: str, control: ControlPlane,
             reader: Reader, recovery: RecoveryReport) -> dict[str, Any]:
    """Media use and watermarks, sessions, placements, recovery, reads (call under the
    store's lock)."""
    st = control.stats()
    now = control.clock.now()
    sessions = []
    for sid in control.session_ids():
        rec = control.session(sid)
        sessions.append({
            "session_id": sid,
            "files": control.files_of(sid),
            "memory_segments": len(rec.memory_segment_ids),
            "ssd_segments": len(rec.ssd_segment_ids),
            "memory_bytes": rec.memory_bytes,
            "ssd_bytes": rec.ssd_bytes,
            "idle_s": round(now - rec.last_access, 3),
            "pinned": rec.num_pins > 0,
            "damaged": control.cut_pending(sid),
        })
    reads = reader.stats()
    g = control.geometry
    return {
        "root": str(root),
        "io_mode": io_mode,
        "reader": reader.name,
        "geometry": {"name": g.name, "num_layers": g.num_layers,
                     "layer_block_bytes": list(g.layer_block_bytes)},
        "media": {
            "memory": {"used_bytes": st.memory_used_bytes,
                       "capacity_bytes": st.memory_capacity_bytes,
                       "high": st.memory_high, "low": st.memory_low,
                       "segments": st.num_memory_segments},
            "ssd": {"used_bytes": st.ssd_used_bytes, "capacity_bytes": st.ssd_capacity_bytes,
                    "high": st.ssd_high, "low": st.ssd_low,
                    "segments": st.num_ssd_segments, "files": st.num_files},
        },
        "num_keys": st.num_keys,
        "placements_by_rule": st.placements_by_rule,
        "sessions": sessions,
        "recovery": {
            "num_segments": recovery.num_segments,
            "damaged_segments": recovery.damaged_segments,
            "damaged_files": recovery.damaged_files,
        },
        "reads": {"commands": reads.commands, "bytes": reads.bytes_read},
    }
