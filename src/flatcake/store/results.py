"""Value types of the public store API: what a call did, in units a caller can log."""

from __future__ import annotations

from dataclasses import dataclass

from flatcake.control.address import Medium


@dataclass(frozen=True, slots=True)
class TurnSignals:
    """What the engine knows about a turn before it runs (placement input).

    Attributes:
        turn_index: the session's turn, 0 for the first.
        context_tokens: tokens of context of this turn (history + new prompt).
        prev_reply_tokens: tokens of the previous reply; ``None`` when unknown.
        shared_refcount: requests sharing these blocks (prefix-tree refcount).
    """

    turn_index: int
    context_tokens: int
    prev_reply_tokens: int | None = None
    shared_refcount: int = 1


@dataclass(frozen=True, slots=True)
class StoreResult:
    """Outcome of ``store_turn``.

    Attributes:
        session_id: the session written.
        num_blocks: new blocks written (0 when every key was already stored).
        first_block: request block index of the first new block.
        medium: where they went (``None`` when nothing was new).
        rule: the placement rule that chose the medium (``""`` when nothing was new).
        address: encoded 64-bit address of the segment (``None`` when nothing was new).
        bytes_written: bytes written (segment header, data and padding).
        write_calls: write system calls (SSD; 0 for memory).
        elapsed_s: wall time of the gather + write + sync.
        error: why the write failed ("" when it did not): an I/O error (ENOSPC, EIO)
            while creating, growing or writing the file. Nothing was stored, the
            allocation was given back, and the session stays usable; the engine
            recomputes those blocks next time.
    """

    session_id: str
    num_blocks: int
    first_block: int
    medium: Medium | None
    rule: str
    address: int | None
    bytes_written: int
    write_calls: int
    elapsed_s: float
    error: str = ""

    @property
    def gb_per_s(self) -> float:
        return self.bytes_written / self.elapsed_s / 1e9 if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class LookupResult:
    """The longest stored prefix of a request's keys: blocks ``[0, num_blocks)``."""

    num_blocks: int
    num_memory_blocks: int
    num_ssd_blocks: int


@dataclass(frozen=True, slots=True)
class LoadResult:
    """Outcome of a restore.

    Attributes:
        num_blocks: request blocks ``[0, num_blocks)`` are now in the paged KV (verified).
            Blocks from ``num_blocks`` on must be recomputed by the caller.
        num_hit_blocks: blocks the index (and the cluster's) held when the restore was
            planned.
        num_memory_blocks, num_ssd_blocks: of ``num_blocks``, per medium.
        commands: SSD read commands issued.
        memory_copies: copies out of the host arena (one per merged range and layer).
        bytes_read: SSD bytes read (wanted + gaps + alignment + whole-segment checks).
        useful_bytes: SSD bytes of the loaded blocks.
        memory_bytes: bytes copied out of the host arena.
        damaged_segments: segments that failed their checksum (served as a miss).
        elapsed_s: wall time from the start of the restore to the last layer ready.
        read_path: ``"zero-copy"`` (reads straight into the paged KV slots) or
            ``"staging"`` (reads into the staging window, one copy into the slots).
        staging_reason: why the restore could not read straight into the slots ("" for
            zero-copy). With zero-copy, slots past ``num_blocks`` may hold bytes of a
            damaged segment or of blocks past the cut: use only ``num_blocks``.
        num_remote_blocks: of ``num_blocks``, blocks other nodes held (read over the
            cluster's remote readers after the local prefix); ``num_hit_blocks``
            counts the ones planned.
        remote_bytes: bytes the remote readers moved (whole segment layers).
    """

    num_blocks: int
    num_hit_blocks: int
    num_memory_blocks: int
    num_ssd_blocks: int
    commands: int
    memory_copies: int
    bytes_read: int
    useful_bytes: int
    memory_bytes: int
    damaged_segments: int
    elapsed_s: float
    read_path: str = "staging"
    staging_reason: str = ""
    num_remote_blocks: int = 0
    remote_bytes: int = 0

    @classmethod
    def miss(cls, num_hit_blocks: int) -> LoadResult:
        """A restore that delivered nothing (every block is recomputed)."""
        return cls(0, num_hit_blocks, 0, 0, 0, 0, 0, 0, 0, 0, 0.0)

    @property
    def gb_per_s(self) -> float:
        """Restored KV bytes (SSD + memory) per second."""
        moved = self.useful_bytes + self.memory_bytes
        return moved / self.elapsed_s / 1e9 if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class ReclaimResult:
    """What ``reclaim`` (or a write's reclaim) dropped."""

    sessions: tuple[str, ...]
    files_deleted: int
    memory_bytes_freed: int
    ssd_segments_dropped: int


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What ``FlatCakeStore.open`` found on disk.

    Attributes:
        num_files: session files scanned.
        num_sessions: sessions with at least one servable segment.
        num_segments: segments re-indexed.
        num_blocks: blocks re-indexed.
        damaged_segments: torn or corrupt segments skipped (the file is cut there).
        damaged_files: files moved to quarantine (unreadable header, or a stray: a
            file whose header names another file id, geometry or span).
        lost_segments: valid segments found after a damaged one and cut off with it
            (their blocks hang off the damaged turn); counted, never silently gone.
        damaged_file_ids: ids of the files with damaged segments or quarantined.
    """

    num_files: int
    num_sessions: int
    num_segments: int
    num_blocks: int
    damaged_segments: int
    damaged_files: int
    lost_segments: int = 0
    damaged_file_ids: tuple[int, ...] = ()
