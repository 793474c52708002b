"""The owner's staging plan for remote SSD reads (``cio.remote_ssd.stage_plan``): ranges
of one file that touch merge into one read, reads widened to 4 KiB, chunks that fit one
half of the staging buffer, wanted bytes kept in request order."""

from __future__ import annotations

import pytest

from flatcake.cio.remote_ssd import ALIGN, stage_plan


def wanted(chunks) -> list[tuple[str, int, int]]:
    return [(r.path, r.offset + d, n) for c in chunks for r in c for d, n in r.pieces]


def test_touching_ranges_of_one_file_merge_into_one_aligned_read() -> None:
    ranges = [("a", 4096 + 100, 1000), ("a", 5196, 3000), ("b", 0, 512), ("a", 8196, 10)]
    (chunk,) = stage_plan(ranges, 1 << 20)
    assert [(r.path, r.offset, r.length, r.at) for r in chunk] == [
        ("a", 4096, 8192, 0), ("b", 0, 4096, 8192), ("a", 8192, 4096, 12288)]
    assert wanted([chunk]) == ranges  # the bytes sent, in request order
    for r in chunk:
        assert r.offset % ALIGN == 0 and r.length % ALIGN == 0 and r.at % ALIGN == 0


def test_chunks_fit_a_half_and_long_ranges_split() -> None:
    half = 4 * ALIGN
    ranges = [("a", 100, 10 * ALIGN), ("a", 100 + 10 * ALIGN, 5)]
    chunks = stage_plan(ranges, half)
    assert len(chunks) > 2
    for chunk in chunks:
        assert sum(r.length for r in chunk) <= half
    got = wanted(chunks)
    assert sum(n for _, _, n in got) == 10 * ALIGN + 5
    at = 100
    for path, off, n in got:  # contiguous, in order
        assert path == "a" and off == at
        at += n


def test_a_half_too_small_is_refused() -> None:
    with pytest.raises(ValueError, match="staging half"):
        stage_plan([("a", 0, 10)], ALIGN)
