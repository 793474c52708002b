"""ControlPlane.recover_files: scanned session-file headers become books again, and
each file gets its verdict (keep, cut, delete, quarantine). The scans are built from
``cio.format``'s own header types, as the data plane's scan returns them."""

from __future__ import annotations

import pytest

from flatcake.cio.filescan import DamagedSegment, ScannedSegment
from flatcake.cio.format import FileHeader, SegmentHeader
from flatcake.control import ControlPlane, FileFate, ScannedFile
from tests.control.helpers import GEOM, K, make, skeys

SPAN = 64 * K  # make()'s session_file_bytes


def file_header(file_id: int, session: str, *, layers: int = GEOM.num_layers,
                span: int = SPAN) -> FileHeader:
    return FileHeader(session, file_id, 0, file_id * span, span,
                      (GEOM.block_bytes_per_layer,) * layers)


def scanned(file_id: int, turns: list[list[bytes]]) -> list[ScannedSegment]:
    """Segments appended one per turn after the 4 KiB file header."""
    out: list[ScannedSegment] = []
    offset, first = K, 0
    for seq, ks in enumerate(turns):
        sh = SegmentHeader(file_id, seq, seq, first, len(ks), GEOM.layer_block_bytes,
                           tuple(ks), (seq, seq + 100))
        out.append(ScannedSegment(offset, sh))
        offset, first = out[-1].end_offset, first + len(ks)
    return out


def clean_file(file_id: int, session: str, sizes: list[int]) -> ScannedFile:
    ks = skeys(session, sum(sizes))
    turns, pos = [], 0
    for n in sizes:
        turns.append(ks[pos:pos + n])
        pos += n
    return ScannedFile(file_id, file_header(file_id, session), scanned(file_id, turns))


class TestVerdicts:
    def test_a_root_after_a_crash(self) -> None:
        cp, clock = make()
        clock.set(100.0)
        clean = clean_file(3, "a", [3, 2])
        torn_segments = clean_file(5, "b", [2, 2, 2]).segments
        torn = ScannedFile(5, file_header(5, "b"), torn_segments[:1],
                           [DamagedSegment(torn_segments[1].file_offset, "torn write", 1, 1)],
                           age_s=40.0)
        unreadable = ScannedFile(6, None, name="/x/6.fcs", error="bad magic")
        stray = ScannedFile(7, file_header(9, "c"), clean_file(9, "c", [1]).segments)
        other_model = ScannedFile(8, file_header(8, "d", layers=4))
        rec = cp.recover_files([clean, torn, unreadable, stray, other_model],
                               other_file_ids=[11])
        fates = {v.file_id: v.fate for v in rec.files}
        assert fates == {3: FileFate.KEEP, 5: FileFate.KEEP, 6: FileFate.QUARANTINE,
                         7: FileFate.QUARANTINE, 8: FileFate.QUARANTINE}
        kept_a, kept_b = rec.files[0], rec.files[1]
        assert (kept_a.end_bytes, kept_a.cut) == (clean.segments[-1].end_offset, False)
        assert (kept_b.end_bytes, kept_b.cut) == (torn_segments[0].end_offset, True)
        assert kept_b.reason == "torn write" and (kept_b.num_damaged, kept_b.num_lost) == (1, 1)
        assert rec.files[2].reason == "unreadable (bad magic)"
        assert rec.files[3].reason.startswith("a stray: its header names file id 9")
        assert (rec.num_files, rec.num_sessions, rec.num_segments, rec.num_blocks) == (5, 2, 3, 7)
        assert (rec.num_damaged, rec.num_lost, rec.num_quarantined) == (1, 1, 3)
        assert rec.damaged_file_ids == (5, 6, 7, 8)
        # The books serve what was kept, with its crcs, and the file's age orders reclaim.
        assert cp.lookup(skeys("a", 5)).num_ssd_blocks == 5
        assert cp.lookup(skeys("b", 6)).num_blocks == 2
        assert {rec.crcs[i] for i in kept_a.segment_ids} == {(0, 100), (1, 101)}
        assert cp.session("b").last_access == 60.0 and cp.session("a").last_access == 100.0
        assert cp.files_of("a") == [3] and cp.file_end_bytes(3) == kept_a.end_bytes
        cp.check_integrity()
        # No id on disk is handed out again, the quarantined and unscanned ones included.
        plan = cp.prepare_store("new", skeys("new", 1), turn_index=0, context_tokens=4)
        assert plan is not None and plan.file_id == 12

    def test_a_segment_the_books_refuse_is_damage(self) -> None:
        cp, _ = make()
        ks = skeys("a", 4)
        repeated = [ks[2], ks[3], ks[2]]  # written by an older version
        f = ScannedFile(1, file_header(1, "a"), scanned(1, [ks[:2], repeated, [ks[3]]]))
        verdict = cp.recover_files([f]).files[0]
        assert verdict.fate == FileFate.KEEP and verdict.cut
        assert verdict.reason.startswith("refused: ") and "repeats" in verdict.reason
        assert (verdict.num_damaged, verdict.num_lost) == (1, 1)
        assert verdict.end_bytes == f.segments[0].end_offset
        assert cp.lookup(ks).num_blocks == 2
        cp.check_integrity()

    def test_nothing_kept_deletes_the_file(self) -> None:
        cp, _ = make()
        k = skeys("a", 1)[0]
        refused = ScannedFile(1, file_header(1, "a"), scanned(1, [[k, k]]))
        empty = ScannedFile(2, file_header(2, "b"), (),
                            [DamagedSegment(K, "zeros to the end of the file")])
        rec = cp.recover_files([refused, empty])
        assert [v.fate for v in rec.files] == [FileFate.DELETE, FileFate.DELETE]
        assert rec.damaged_file_ids == (1, 2) and rec.num_sessions == 0
        assert cp.session_ids() == [] and cp.ssd_used_bytes == 0
        cp.check_integrity()


class TestWrongModel:
    def test_no_file_of_this_geometry_refuses_and_touches_nothing(self) -> None:
        cp, _ = make()
        files = [ScannedFile(4, file_header(4, "a", layers=4)), ScannedFile(5, None)]
        with pytest.raises(ValueError, match="holds 4 layers x 128 B blocks, but geometry"):
            cp.recover_files(files)
        with pytest.raises(ValueError, match="written with span"):
            cp.recover_files([ScannedFile(4, file_header(4, "a", span=2 * SPAN))])
        plan = cp.prepare_store("s", skeys("s", 1), turn_index=0, context_tokens=4)
        assert plan is not None and plan.file_id == 0

    def test_refuse_mode_refuses_any_other_model(self) -> None:
        cp, _ = make()
        files = [clean_file(1, "a", [2]), ScannedFile(2, file_header(2, "b", layers=4))]
        with pytest.raises(ValueError, match="session file 2 holds 4 layers"):
            cp.recover_files(files, mismatch="refuse")
        with pytest.raises(ValueError, match="mismatch must be"):
            cp.recover_files(files, mismatch="skip")
        assert cp.stats().num_ssd_segments == 0


def test_two_hosts_reach_the_same_books() -> None:
    """The connector's worker half settles its files with a scratch ControlPlane: the
    same scans give it the same verdicts as the scheduler half's books."""
    scans = [clean_file(1, "a", [2, 3]), clean_file(2, "b", [1])]
    cp, _ = make()
    scratch = ControlPlane(cp.geometry, cp.config)
    assert cp.recover_files(scans).files == scratch.recover_files(scans).files
