"""The SSD read planner's inline range of a run every layer holds is ``_Layer.held``'s:
over varied geometries (layer sizes, segment lengths, runs), every piece of every layer's
reads names exactly the bytes ``held`` says the run's blocks lie at."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from flatcake.config import PlannerConfig
from flatcake.control.address import Medium, encode_address
from flatcake.control.index import HitRun, Segment
from flatcake.layout import SegmentLayout
from flatcake.plan.reads import _Layer, _plan_ssd_layer, _spans
from tests.control.helpers import keys

SIZES = (512, 4096, 6144, 8192, 12288, 1000)


@st.composite
def hits(draw: st.DrawFn) -> tuple[list[HitRun], tuple[int, ...]]:
    sizes = tuple(draw(st.lists(st.sampled_from(SIZES), min_size=1, max_size=5)))
    runs: list[HitRun] = []
    ends: dict[int, int] = {}
    prefix = 0
    for seg_id in range(1, draw(st.integers(1, 6)) + 1):
        file_id = draw(st.integers(0, 2))
        n = draw(st.integers(1, 9))
        lay = SegmentLayout.for_ssd(n, sizes)
        off = ends.get(file_id, 4096) + draw(st.sampled_from((0, 4096, 65536)))
        ends[file_id] = off + lay.total_bytes
        seg = Segment(seg_id, "s", Medium.SSD, encode_address(Medium.SSD, 0, off), lay,
                      tuple(keys(seg_id * 100, seg_id * 100 + n)), 0, file_id, off)
        start = draw(st.integers(0, n - 1))
        count = draw(st.integers(1, n - start))
        runs.append(HitRun(seg, start, count, prefix))
        prefix += count
    return runs, sizes


@settings(max_examples=200, deadline=None)
@given(hits())
def test_inline_range_is_held(case: tuple[list[HitRun], tuple[int, ...]]) -> None:
    runs, sizes = case
    ssd, _, _ = _spans(runs)
    assert all(s.windowed is None for s in ssd)
    for index, (before, size) in enumerate(zip(
            itertools.accumulate(sizes, initial=0), sizes, strict=False)):
        layer = _Layer(before, size, index)
        cfg = PlannerConfig()
        ops, _ = _plan_ssd_layer(ssd, before, size, index, cfg.gap_limit_bytes,
                                 cfg.max_read_bytes)
        got = sorted((p.dest_offset, op.file_id, op.file_offset + p.offset_in_op, p.length)
                     for op in ops for p in op.pieces)
        want = sorted((at * size, s.file_id, lo, length)
                      for s in ssd for lo, length, at in [layer.held(s)])
        assert got == want
