"""Tensor-parallel ranks of one engine attached to one node service (the connector's
two halves without vLLM: one ``RemoteSchedulerSide``, one attached ``WorkerSide`` per
rank, each rank with its own paged KV of random bytes).

Heads split over the ranks: a block is one entry in the books; each rank writes and
restores its own part, at the same offsets of the same file in its part's directory.
Replicated KV (MLA's latent): one part, in the root itself, written once by rank 0
(rank 1 writes nothing) and restored by both ranks, from SSD and from the one arena.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from flatcake.cio.filescan import scan_session_file
from flatcake.connectors.scheduler_side import RequestView
from flatcake.link import wire
from flatcake.link.client import worker_root
from flatcake.link.wire import TensorRanks
from flatcake.service.endpoint import ask_status
from tests.connectors.sides_harness import G, end, finish, tokens, view
from tests.service.helpers import Service, TensorEngine

LAYER_BLOCK = G.layer_block_bytes[0]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Service]:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock").start()
    yield svc
    assert svc.stop() == 0, svc.stderr()


def session_files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("sessions/*"))


def first_turns(e: TensorEngine) -> tuple[list[int], dict[tuple[int, int, int], bytes]]:
    """Turn 0 of session s stored (3 full blocks in slots 5-7); every rank's bytes."""
    turn0 = list(range(100, 113))
    p = finish(e, "t0", turn0, [5, 6, 7, 8], out=3, session="s")
    assert p["placement"] == "ssd:first_turn" and p["stored_blocks"] == 3
    _, sending, _, _ = e.step()
    assert sending == {"t0"}
    return turn0, {(rank, layer, j): e.rank_block(rank, layer, s)
                   for rank in range(len(e.workers)) for layer in range(G.num_layers)
                   for j, s in enumerate([5, 6, 7])}


def restore(e: TensorEngine, turn0: list[int]) -> list[int]:
    """Turn 1: the 3 blocks from SSD into slots 20-22 of every rank."""
    turn1 = tokens(turn0, 8, 200)
    assert e.sched.num_matched_tokens(view("t1", turn1, session="s"), 0) == (12, True)
    e.sched.after_alloc("t1", [20, 21, 22, 23, 24], 12)
    _, _, recving, invalid = e.step()
    assert recving == {"t1"} and invalid == set()
    return turn1


def test_replicated_kv_is_written_once_by_rank_0_and_read_by_every_rank(
        node: Service) -> None:
    e = TensorEngine(node.sock, TensorRanks(2, replicated=True))
    try:
        turn0, before = first_turns(e)
        # One copy: one file in the root itself, written by rank 0 only.
        (rel,) = session_files(node.root)
        assert rel.parts[0] == "sessions"
        ((seg,), _bad) = scan_session_file(node.root / rel)[1:]
        assert seg.header.num_blocks == 3
        written = [w.take_stats().get("bytes_written_ssd", 0) for w in e.workers]
        assert written[0] >= 3 * G.num_layers * LAYER_BLOCK and written[1] == 0
        assert ask_status(node.sock, 5.0)["replicated_kv"] is True
        turn1 = restore(e, turn0)
        for rank in (0, 1):  # both ranks get rank 0's bytes (rank 1's differed)
            for layer in range(G.num_layers):
                for j in range(3):
                    assert e.rank_block(rank, layer, 20 + j) == before[(0, layer, j)]
        assert before[(1, 0, 0)] != before[(0, 0, 0)]
        # Turn 1's short reply: its new blocks go to the one arena, written by rank 0;
        # turn 2 restores them into both ranks from memory.
        _, params = end(e, RequestView("t1", view("t1", turn1).keys, len(turn1),
                                       len(turn1), 3, 12, "s"), [20, 21, 22, 23, 24])
        assert params["flatcake"]["placement"] == "memory:short_reply"
        e.step()
        mem = {(layer, j): e.rank_block(0, layer, s) for layer in range(G.num_layers)
               for j, s in enumerate([23, 24])}
        turn2 = tokens(turn1[:20], 8, 300)
        assert e.sched.num_matched_tokens(view("t2", turn2, session="s"), 0)[0] == 20
        e.sched.after_alloc("t2", list(range(40, 46)), 20)
        _, _, _, invalid = e.step()
        assert invalid == set()
        for rank in (0, 1):
            for (layer, j), raw in mem.items():
                assert e.rank_block(rank, layer, 43 + j) == raw
        assert [w.take_stats().get("bytes_written_memory", 0) for w in e.workers][1] == 0
    finally:
        e.close()


def test_split_heads_are_one_entry_with_a_part_per_rank(node: Service) -> None:
    e = TensorEngine(node.sock, TensorRanks(2))
    try:
        turn0, before = first_turns(e)
        files = session_files(node.root)
        assert [f.parts[0] for f in files] == ["tp0", "tp1"]  # one file per part...
        assert files[0].name == files[1].name  # ...the same file, the same offsets
        sizes = {(node.root / f).stat().st_size for f in files}
        assert len(sizes) == 1
        assert ask_status(node.sock, 5.0)["sessions"] == 1  # one entry in the books
        restore(e, turn0)
        for rank in (0, 1):  # each rank gets its own part back
            for layer in range(G.num_layers):
                for j in range(3):
                    assert e.rank_block(rank, layer, 20 + j) == before[(rank, layer, j)]
    finally:
        e.close()


def test_a_service_of_replicated_kv_refuses_split_heads(node: Service) -> None:
    e = TensorEngine(node.sock, TensorRanks(2, replicated=True))
    try:
        with pytest.raises(wire.NodeRefused, match=r"tensor_parallel_size=2 \(replicated "
                           r"KV\); an engine of .* at tensor_parallel_size=2 cannot"):
            worker_root(str(node.sock), 1.0, 1, G, TensorRanks(2), wait_s=5)
    finally:
        e.close()
