"""Per-session books kept by the control plane (no I/O).

A session owns its segments (in memory and on SSD), its SSD files and the memory
copies of some of its SSD segments. Reclaim takes sessions oldest ``last_access``
first, and never one with ``num_pins > 0`` (a restore is reading it, or one of its
writes is still in flight); see ``control.ControlPlane`` for the units it drops.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flatcake.control.address import Medium

MAX_SESSION_ID_BYTES = 2048  # UTF-8 bytes; the session file header holds the id


def check_session_id(session_id: object, field_name: str = "session_id") -> str:
    """Return ``session_id`` if it is a non-empty str; else raise ``ValueError``.

    Session ids are arbitrary text: they are never used as path components (files are
    named by ``file_id``)."""
    if not isinstance(session_id, str) or not session_id:
        raise ValueError(f"{field_name} must be a non-empty str, got {session_id!r}")
    try:
        size = len(session_id.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(f"{field_name} must be valid text (UTF-8 encodable), got "
                         f"{session_id[:64]!r}: {exc.reason}") from None
    if size > MAX_SESSION_ID_BYTES:
        raise ValueError(f"{field_name} must be at most {MAX_SESSION_ID_BYTES} UTF-8 bytes "
                         f"(it is stored in the session file header), got {size}")
    return session_id


@dataclass(slots=True)
class SessionRecord:
    """Books of one session (mutable; owned by the ``ControlPlane``).

    Attributes:
        session_id: the session.
        last_access: clock time of the last store, load or touch.
        num_pins: active restores reading the session plus writes in flight into it.
        memory_segment_ids: published memory segments, oldest first.
        ssd_segment_ids: published SSD segments, oldest first.
        memory_bytes: arena bytes held (published and in-flight writes).
        ssd_bytes: SSD bytes held: segments (published and in-flight writes) plus the
            4 KiB header of each of its session files.
        copy_ids: SSD segments (ids) that also have a published memory copy.
        copy_bytes: arena bytes held by memory copies (published and in-flight writes);
            not in ``memory_bytes``, which counts segments whose home is memory.
    """

    session_id: str
    last_access: float
    num_pins: int = 0
    memory_segment_ids: list[int] = field(default_factory=list)
    ssd_segment_ids: list[int] = field(default_factory=list)
    memory_bytes: int = 0
    ssd_bytes: int = 0
    copy_ids: list[int] = field(default_factory=list)
    copy_bytes: int = 0

    def bytes_on(self, medium: Medium) -> int:
        return self.memory_bytes if medium == Medium.MEMORY else self.ssd_bytes

    def segment_ids_on(self, medium: Medium) -> list[int]:
        return self.memory_segment_ids if medium == Medium.MEMORY else self.ssd_segment_ids

    @property
    def num_segments(self) -> int:
        return len(self.memory_segment_ids) + len(self.ssd_segment_ids)
