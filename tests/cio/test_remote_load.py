"""The remote part of a load without a network: remote runs from index hits
(``plan.remote``), and ``restore_remote`` over the dispatch with in-process readers that
hand out another store's bytes: verified before use, a bad layer or a missing reader
ends the prefix, layers grouped to fit the window."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from flatcake.cio.dispatch import ReaderDispatch
from flatcake.cio.paged import PagedKV
from flatcake.cio.remote_load import Consume, restore_remote
from flatcake.control.address import Medium, encode_address
from flatcake.layout import SegmentLayout
from flatcake.plan.remote import RemoteRun, remote_runs, runs_of_part, trim_runs

LAYERS, BBPL = 3, 64


@dataclass
class Hit:
    node: int
    segment_id: int
    position: int
    record: dict[str, Any]


def segment(node: int, nblocks: int, seed: int, offset: int = 0) -> tuple[np.ndarray, dict]:
    data = np.random.default_rng(seed).integers(0, 256, LAYERS * nblocks * BBPL, np.uint8)
    lb = nblocks * BBPL
    crcs = [zlib.crc32(data[i * lb:(i + 1) * lb].tobytes()) for i in range(LAYERS)]
    rec = {"base": encode_address(Medium.MEMORY, node, offset), "nb": nblocks, "nl": LAYERS,
           "bbpl": BBPL, "hdr": 0, "file": "", "foff": 0, "crcs": crcs}
    return data, rec


class Reader:
    """Reads whole layers of segments from an in-process 'arena' of another node."""

    def __init__(self, arena: np.ndarray, window_bytes: int = 1 << 20) -> None:
        self.arena = arena
        self.window_bytes = window_bytes
        self.calls: list[range] = []

    def read_layers(self, run: RemoteRun, layers: range, consume: Consume) -> bool:
        self.calls.append(layers)
        base = run.address & ((1 << 48) - 1)
        n = run.layout.layer_bytes(0)
        return all(consume(layer, self.arena[base + layer * n:base + (layer + 1) * n])
                   for layer in layers)

    def close(self) -> None:
        pass


def paged(slots: int) -> tuple[PagedKV, list[torch.Tensor]]:
    kv = [torch.zeros((slots, BBPL), dtype=torch.uint8) for _ in range(LAYERS)]
    return PagedKV(kv, BBPL), kv


def test_runs_split_by_node_segment_and_position() -> None:
    _, rec_a = segment(2, 4, 0)
    _, rec_b = segment(3, 2, 1)
    hits = [Hit(2, 10, 1, rec_a), Hit(2, 10, 2, rec_a), Hit(2, 10, 3, rec_a),
            Hit(3, 11, 0, rec_b), Hit(3, 11, 1, rec_b)]
    runs = remote_runs(hits, 5, (BBPL,) * LAYERS)
    assert [(r.node, r.request_start, r.start_pos, r.count) for r in runs] == [
        (2, 5, 1, 3), (3, 8, 0, 2)]
    # A record of another geometry stops the runs there; trimming keeps the continuation.
    assert remote_runs(hits, 5, (BBPL,) * (LAYERS + 1)) == ()
    # Positions past the record's blocks: that run and the rest are a miss.
    assert [r.node for r in remote_runs([*hits[3:], Hit(3, 11, 2, rec_b)], 0,
                                        (BBPL,) * LAYERS)] == []
    assert [r.count for r in remote_runs([*hits[:3], Hit(3, 11, 1, rec_b),
                                          Hit(3, 11, 2, rec_b)], 0, (BBPL,) * LAYERS)] == [3]
    assert [(r.request_start, r.start_pos, r.count) for r in trim_runs(runs, 6)] == [
        (6, 2, 2), (8, 0, 2)]
    assert trim_runs(runs, 4) == ()


def _restore(runs: tuple[RemoteRun, ...], dispatch: ReaderDispatch, kv: PagedKV,
             n: int) -> tuple[int, list[range]]:
    signalled: list[range] = []
    out = restore_remote(runs, dispatch.remote, kv, list(range(n)), signalled.append)
    return out.loaded_end, signalled


def test_remote_blocks_are_verified_and_scattered() -> None:
    data, rec = segment(1, 4, 7)
    dispatch = ReaderDispatch()
    dispatch.register_remote(Medium.MEMORY, 1, Reader(data))
    runs = remote_runs([Hit(1, 3, p, rec) for p in range(1, 4)], 0, (BBPL,) * LAYERS)
    kv, tensors = paged(8)
    end, signalled = _restore(runs, dispatch, kv, 3)
    assert end == 3 and [list(r) for r in signalled] == [[0, 1, 2]]
    lb = 4 * BBPL
    for layer in range(LAYERS):
        want = data[layer * lb + BBPL:(layer + 1) * lb].reshape(3, BBPL)
        assert np.array_equal(tensors[layer][:3].numpy(), want)


def test_a_bad_layer_or_a_missing_reader_ends_the_prefix() -> None:
    a, rec_a = segment(1, 2, 1)
    b, rec_b = segment(2, 2, 2)
    runs = remote_runs([Hit(1, 1, 0, rec_a), Hit(1, 1, 1, rec_a), Hit(2, 2, 0, rec_b),
                        Hit(2, 2, 1, rec_b)], 0, (BBPL,) * LAYERS)
    dispatch = ReaderDispatch()
    dispatch.register_remote(Medium.MEMORY, 1, Reader(a))
    assert _restore(runs, dispatch, paged(8)[0], 4)[0] == 2  # node 2: no reader
    bad = b.copy()
    bad[2 * BBPL * 2 + 3] ^= 1  # a flipped bit in layer 2 of node 2's segment
    dispatch.register_remote(Medium.MEMORY, 2, Reader(bad))
    end, signalled = _restore(runs, dispatch, paged(8)[0], 4)
    assert end == 2 and len(signalled) == 1


def test_layers_are_grouped_to_fit_the_window() -> None:
    data, rec = segment(1, 2, 3)
    reader = Reader(data, window_bytes=2 * BBPL * 2)  # two layers of the segment
    dispatch = ReaderDispatch()
    dispatch.register_remote(Medium.MEMORY, 1, reader)
    runs = remote_runs([Hit(1, 1, 0, rec), Hit(1, 1, 1, rec)], 0, (BBPL,) * LAYERS)
    end, signalled = _restore(runs, dispatch, paged(4)[0], 2)
    assert end == 2 and [list(r) for r in reader.calls] == [[0, 1], [2]]
    assert [list(r) for r in signalled] == [[0, 1], [2]]
    small = ReaderDispatch()
    small.register_remote(Medium.MEMORY, 1, Reader(data, window_bytes=BBPL))
    assert _restore(runs, small, paged(4)[0], 2)[0] == 0  # not even one layer fits


def test_bad_runs_and_registrations_are_refused() -> None:
    with pytest.raises(ValueError, match="outside a segment"):
        RemoteRun(encode_address(Medium.MEMORY, 1, 0), 0, 3, 2,
                  SegmentLayout(4, (BBPL,) * LAYERS, 0), "", 0, (0,) * LAYERS)
    with pytest.raises(ValueError, match="file name"):
        RemoteRun(encode_address(Medium.SSD, 1, 0), 0, 0, 2,
                  SegmentLayout(4, (BBPL,) * LAYERS, 0), "", 0, (0,) * LAYERS)
    dispatch = ReaderDispatch()
    with pytest.raises(ValueError, match="remote reader"):
        dispatch.register_remote(Medium.MEMORY, 0, Reader(np.zeros(8, np.uint8)))


def test_a_record_of_several_parts_gives_each_rank_its_own_crcs() -> None:
    data0, rec = segment(2, 2, 0)
    data1, rec1 = segment(2, 2, 1)  # part 1: other bytes at the same offsets
    rec = {**rec, "parts": [rec["crcs"], rec1["crcs"]]}
    (run,) = remote_runs([Hit(2, 10, 0, rec), Hit(2, 10, 1, rec)], 0, (BBPL,) * LAYERS)
    assert run.of_part(1, 2) is not None and run.of_part(1, 2).crcs == tuple(rec1["crcs"])
    assert run.of_part(0, 2).crcs == tuple(rec["crcs"])
    # Another number of parts holds other bytes: no run (a miss), never other heads.
    assert run.of_part(0, 1) is None and run.of_part(0, 4) is None
    (one,) = remote_runs([Hit(2, 10, 0, rec1)], 0, (BBPL,) * LAYERS)
    assert one.of_part(0, 1) is one and one.of_part(0, 2) is None
    assert runs_of_part((one,), 0, 2) == () and runs_of_part((run,), 1, 2)[0].parts == ()
    assert trim_runs((run,), 1)[0].parts == run.parts
    # Rank 1's part checks part 1's bytes and refuses part 0's.
    dispatch = ReaderDispatch()
    dispatch.register_remote(Medium.MEMORY, 2, Reader(data1))
    kv, tensors = paged(4)
    assert _restore((run.of_part(1, 2),), dispatch, kv, 2)[0] == 2
    assert tensors[0][0].numpy().tobytes() == data1[:BBPL].tobytes()
    dispatch0 = ReaderDispatch()
    dispatch0.register_remote(Medium.MEMORY, 2, Reader(data0))
    assert _restore((run.of_part(1, 2),), dispatch0, paged(4)[0], 2)[0] == 0
