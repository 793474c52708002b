"""Block index: run-based longest-prefix lookup, first-writer-wins, shadows, integrity."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from flatcake.control.address import Medium, encode_address
from flatcake.control.index import EMPTY_HIT, BlockIndex, HitRun, PrefixHit, Segment
from flatcake.layout import SegmentLayout
from tests.control.helpers import key, keys, memory_segment, ssd_segment


class TestLookupScenarios:
    def test_two_turns_one_on_ssd_one_in_memory(self) -> None:
        idx = BlockIndex()
        turn0 = ssd_segment(1, keys(0, 10))
        turn1 = memory_segment(2, keys(10, 14), turn=1)
        idx.publish(turn0)
        idx.publish(turn1)
        # The request: the whole history plus 3 new blocks.
        hit = idx.lookup(keys(0, 17))
        assert (hit.num_blocks, hit.num_ssd_blocks, hit.num_memory_blocks) == (14, 10, 4)
        assert hit.runs == (HitRun(turn0, 0, 10, 0), HitRun(turn1, 0, 4, 10))
        assert hit.session_ids == {"s"} and hit.needs_ssd

    def test_miss_and_prefix_stop(self) -> None:
        idx = BlockIndex()
        idx.publish(ssd_segment(1, keys(0, 5)))
        assert idx.lookup(keys(100, 103)) is EMPTY_HIT
        assert idx.lookup([]) is EMPTY_HIT
        # key 2 differs: only blocks 0 and 1 hit, even though 3 and 4 are indexed.
        req = [key(0), key(1), key(99), key(3), key(4)]
        hit = idx.lookup(req)
        assert hit.num_blocks == 2 and hit.runs == (HitRun(idx.segment(1), 0, 2, 0),)

    def test_request_may_start_inside_a_segment(self) -> None:
        idx = BlockIndex()
        seg = ssd_segment(1, keys(0, 8))
        idx.publish(seg)
        assert idx.lookup(keys(3, 6)).runs == (HitRun(seg, 3, 3, 0),)

    def test_long_history_in_one_segment_is_one_run(self) -> None:
        idx = BlockIndex()
        seg = ssd_segment(1, keys(0, 50_000))
        idx.publish(seg)
        hit = idx.lookup([*keys(0, 50000), key(10 ** 9)])
        assert hit.num_blocks == 50_000 and len(hit.runs) == 1
        # A mismatch deep inside the run is found exactly (bisection over slices).
        req = keys(0, 50_000)
        req[31_337] = key(10**9)
        assert idx.lookup(req).num_blocks == 31_337

    def test_location_and_addresses(self) -> None:
        idx = BlockIndex()
        seg = ssd_segment(1, keys(0, 4), num_layers=3, block_bytes=100, file_offset=8192,
                          base_offset=1 << 30)
        idx.publish(seg)
        loc = idx.get(key(2))
        assert loc is not None and loc.position == 2 and loc.segment is seg
        header = seg.layout.header_bytes
        assert loc.address(1) == seg.base_address + header + 1 * 400 + 2 * 100
        assert key(2) in idx and key(9) not in idx and len(idx) == 4


class TestOwnership:
    def test_first_writer_wins_and_shadow_takes_over(self) -> None:
        idx = BlockIndex()
        a = ssd_segment(1, keys(0, 4), session_id="a")
        b = memory_segment(2, keys(2, 6), session_id="b")
        assert idx.publish(a) == 4
        assert idx.publish(b) == 2  # keys 2, 3 stay with a
        assert idx.get(key(3)).segment is a  # type: ignore[union-attr]
        idx.check_integrity()
        idx.remove_segment(1)
        # b still holds keys 2..5, so they stay findable; 0 and 1 are gone.
        assert idx.get(key(3)).segment is b  # type: ignore[union-attr]
        assert key(0) not in idx and len(idx) == 4
        assert idx.lookup(keys(2, 6)).runs == (HitRun(b, 0, 4, 0),)
        idx.check_integrity()

    def test_lookup_continues_in_a_shadowing_segment(self) -> None:
        idx = BlockIndex()
        a = ssd_segment(1, keys(0, 2), session_id="a")
        b = ssd_segment(2, keys(0, 6), session_id="b", file_id=1)
        idx.publish(a)
        idx.publish(b)
        hit = idx.lookup(keys(0, 6))
        assert hit.num_blocks == 6
        assert hit.runs == (HitRun(a, 0, 2, 0), HitRun(b, 2, 4, 2))

    def test_errors(self) -> None:
        idx = BlockIndex()
        idx.publish(ssd_segment(1, keys(0, 2)))
        with pytest.raises(ValueError, match="segment_id 1"):
            idx.publish(ssd_segment(1, keys(5, 6)))
        with pytest.raises(KeyError, match="segment_id 7"):
            idx.remove_segment(7)
        with pytest.raises(ValueError, match="same key twice"):
            idx.publish(ssd_segment(3, [key(9), key(8), key(9)]))
        # refused whole: none of its keys indexed, its id still free
        assert idx.lookup([key(8)]).num_blocks == idx.lookup([key(9)]).num_blocks == 0
        assert idx.publish(ssd_segment(3, [key(8), key(9)])) == 2
        with pytest.raises(ValueError, match="same key twice"):  # past an indexed key
            idx.publish(ssd_segment(4, [key(0), key(7), key(7)]))
        assert idx.lookup([key(7)]).num_blocks == 0
        with pytest.raises(KeyError, match="segment_id 8"):
            idx.segment(8)


class TestSegmentValidation:
    def _layout(self, n: int = 2, ssd: bool = True) -> SegmentLayout:
        sizes = (64, 64)
        return SegmentLayout.for_ssd(n, sizes) if ssd else SegmentLayout.for_memory(n, sizes)

    @pytest.mark.parametrize(
        ("kwargs", "needle"),
        [
            ({"keys": (key(1),)}, "num_blocks"),
            ({"base_address": encode_address(Medium.MEMORY, 0, 0)}, "medium"),
            ({"file_id": None}, "file_id"),
            ({"file_offset": 100}, "file_offset"),
            ({"turn_index": -1}, "turn_index"),
        ],
    )
    def test_bad_fields_named(self, kwargs: dict[str, object], needle: str) -> None:
        args: dict[str, object] = dict(
            segment_id=1, session_id="s", medium=Medium.SSD,
            base_address=encode_address(Medium.SSD, 0, 4096), layout=self._layout(),
            keys=(key(1), key(2)), turn_index=0, file_id=0, file_offset=4096)
        args.update(kwargs)
        with pytest.raises(ValueError, match=needle):
            Segment(**args)  # type: ignore[arg-type]

    def test_memory_segment_has_no_file_or_header(self) -> None:
        with pytest.raises(ValueError, match="file_id"):
            Segment(1, "s", Medium.MEMORY, encode_address(Medium.MEMORY, 0, 0),
                    self._layout(ssd=False), (key(1), key(2)), 0, file_id=3)
        with pytest.raises(ValueError, match="header_bytes"):
            Segment(1, "s", Medium.MEMORY, encode_address(Medium.MEMORY, 0, 0),
                    self._layout(), (key(1), key(2)), 0)


def reference_prefix(live: list[Segment], req: list[bytes]) -> int:
    held = {k for s in live for k in s.keys}
    n = 0
    while n < len(req) and req[n] in held:
        n += 1
    return n


class IndexMachine(RuleBasedStateMachine):
    """Random publishes and removals over a small key universe (so keys overlap), checked
    against a plain model: the live segments."""

    @initialize()
    def setup(self) -> None:
        self.idx = BlockIndex()
        self.live: list[Segment] = []
        self.next_id = 0

    @rule(start=st.integers(0, 30), length=st.integers(1, 12), ssd=st.booleans(),
          stride=st.sampled_from([1, 1, 1, 2]))
    def publish(self, start: int, length: int, ssd: bool, stride: int) -> None:
        ks = [key(start + i * stride) for i in range(length)]
        self.next_id += 1
        seg = (ssd_segment(self.next_id, ks, file_id=self.next_id) if ssd
               else memory_segment(self.next_id, ks))
        self.idx.publish(seg)
        self.live.append(seg)

    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        if not self.live:
            return
        seg = data.draw(st.sampled_from(self.live))
        assert self.idx.remove_segment(seg.segment_id) is seg
        self.live.remove(seg)

    @rule(start=st.integers(0, 40), length=st.integers(0, 20), holes=st.sets(
        st.integers(0, 19), max_size=2))
    def lookup(self, start: int, length: int, holes: set[int]) -> None:
        req = [key(10_000 + i) if i in holes else key(start + i) for i in range(length)]
        hit = self.idx.lookup(req)
        assert isinstance(hit, PrefixHit)
        assert hit.num_blocks == reference_prefix(self.live, req)
        assert hit.num_memory_blocks + hit.num_ssd_blocks == hit.num_blocks
        pos = mem = 0
        for seg, j, count, prefix_start in hit.runs:
            assert prefix_start == pos and count > 0
            assert seg in self.live
            assert list(seg.keys[j:j + count]) == req[pos:pos + count]
            if seg.medium == Medium.MEMORY:
                mem += count
            pos += count
        assert pos == hit.num_blocks and mem == hit.num_memory_blocks

    @invariant()
    def books_agree(self) -> None:
        self.idx.check_integrity()
        held = {k for s in self.live for k in s.keys}
        assert len(self.idx) == len(held)
        assert self.idx.num_segments == len(self.live)
        for k in held:
            loc = self.idx.get(k)
            assert loc is not None and loc.segment.keys[loc.position] == k


TestIndexMachine = IndexMachine.TestCase
TestIndexMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
