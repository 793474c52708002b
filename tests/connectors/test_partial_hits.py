"""Partial hits through the connector's two halves (no vLLM): the engine holds all but the
last blocks of a stored prompt, and the restore reads only the blocks it delivers (the
segment's block crcs check them), byte for byte, whether or not the engine's KV could
take O_DIRECT reads (a connector load is fenced, given up at its deadline, so it always
reads through the staging window: ``tests/connectors/test_async_deadline.py``). A
rotted byte inside a delivered block is caught; one in a block the engine holds is
never read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flatcake.cio.filescan import scan_session_file
from flatcake.cio.names import SESSIONS_DIR
from flatcake.geometry import KVGeometry
from flatcake.layout import ALIGN
from tests.cio.helpers import flip_byte
from tests.connectors.sides_harness import Harness, finish, view

PROMPT_BLOCKS = 8
TPB = 4
SLOTS = list(range(1, 1 + PROMPT_BLOCKS))  # the stored prompt's blocks sit here
LOAD_SLOTS = list(range(20, 30))  # the second request's blocks


def geometry(head_dim: int) -> KVGeometry:
    """3 layers of 4 KiB-multiple blocks (2 x 4 x 2 x head_dim float32): no alignment
    bytes, so every byte read beyond the delivered ones is a byte read for nothing."""
    return KVGeometry(num_layers=3, tokens_per_block=TPB, num_kv_heads=2, head_dim=head_dim,
                      dtype="float32", name="tiny")


class Run:
    """A harness whose prompt of ``PROMPT_BLOCKS`` blocks is stored on SSD, with the
    outcome of every restore recorded."""

    def __init__(self, root: Path, g: KVGeometry, path: str = "staging") -> None:
        self.g = g
        # A paged KV 64 bytes off a page cannot take O_DIRECT reads; an aligned one
        # could, but the connector's loads are fenced: the staging path either way.
        self.h = Harness(root, g=g, misalign=0 if path == "aligned" else 64)
        self.toks = [*range(1000, 1000 + PROMPT_BLOCKS * TPB), 7]
        params = finish(self.h, "first", self.toks, SLOTS, out=8)
        assert params["placement"] == "ssd:first_turn"
        self.h.step()
        self.want = {(layer, b): self.h.block(layer, SLOTS[b])
                     for layer in range(g.num_layers) for b in range(PROMPT_BLOCKS)}
        self.outcomes: list[Any] = []
        submit = self.h.worker.executor.submit_load

        def recording(task: Any, paged: Any, ready: Any, on_done: Any = None,
                      fence: Any = None) -> Any:
            def done(outcome: Any) -> None:
                self.outcomes.append(outcome)
                if on_done is not None:
                    on_done(outcome)
            return submit(task, paged, ready, done, fence=fence)

        self.h.worker.executor.submit_load = recording  # type: ignore[method-assign]

    def partial(self, rid: str, engine_blocks: int) -> tuple[set[int], dict[str, int]]:
        """A request repeating the prompt while the engine holds its first
        ``engine_blocks`` blocks: (slots reported invalid, the worker's byte counts)."""
        self.h.worker.take_stats()
        before = [self.h.block(layer, s) for layer in range(self.g.num_layers)
                  for s in LOAD_SLOTS]
        v = view(rid, [*self.toks, 8, 9])
        hit_tokens = (PROMPT_BLOCKS - engine_blocks) * TPB
        assert self.h.sched.num_matched_tokens(v, engine_blocks * TPB) == (hit_tokens, True)
        self.h.sched.after_alloc(rid, LOAD_SLOTS, hit_tokens)
        _, _, _, invalid = self.h.step()
        # The engine's own blocks are never written.
        after = [self.h.block(layer, s) for layer in range(self.g.num_layers)
                 for s in LOAD_SLOTS]
        for i, (a, b) in enumerate(zip(before, after, strict=True)):
            if i % len(LOAD_SLOTS) < engine_blocks:
                assert a == b
        return invalid, self.h.worker.take_stats()

    def delivered_exact(self, engine_blocks: int) -> bool:
        return all(self.h.block(layer, LOAD_SLOTS[b]) == self.want[(layer, b)]
                   for layer in range(self.g.num_layers)
                   for b in range(engine_blocks, PROMPT_BLOCKS))


def session_file(root: Path) -> Path:
    (path,) = sorted((root / SESSIONS_DIR).iterdir())
    return path


@pytest.mark.parametrize(("head_dim", "path"), [(64, "misaligned"), (128, "aligned")])
@pytest.mark.parametrize("engine_blocks", [7, 5])
def test_a_partial_hit_reads_only_the_blocks_it_delivers(
        tmp_path: Path, head_dim: int, path: str, engine_blocks: int) -> None:
    run = Run(tmp_path, geometry(head_dim), path)
    invalid, stats = run.partial("next", engine_blocks)
    assert invalid == set()
    assert run.delivered_exact(engine_blocks)
    (outcome,) = run.outcomes
    assert not outcome.restore.zero_copy
    delivered = (PROMPT_BLOCKS - engine_blocks) * run.g.block_bytes
    # 4 KiB-multiple blocks: nothing is read for alignment, so the bound is exact.
    assert stats["bytes_read_ssd"] <= 1.02 * delivered
    assert stats["bytes_read_ssd"] == delivered
    run.h.close()


def test_the_alignment_bound_of_blocks_smaller_than_a_page(tmp_path: Path) -> None:
    # 1 KiB blocks (head_dim 16): a command's ends are widened to 4 KiB, at most
    # ALIGN - 1 bytes on each side, so reads <= 1.02 x delivered + 2 x ALIGN a command.
    run = Run(tmp_path, geometry(16))
    invalid, stats = run.partial("next", 6)
    assert invalid == set() and run.delivered_exact(6)
    delivered = 2 * run.g.block_bytes
    (outcome,) = run.outcomes
    assert stats["bytes_read_ssd"] <= 1.02 * delivered + 2 * ALIGN * outcome.restore.commands
    # The whole segment would be 8 KiB a layer; the two blocks' page is 4 KiB.
    assert stats["bytes_read_ssd"] == ALIGN * run.g.num_layers
    run.h.close()


def _rot(root: Path, layer: int, block: int) -> None:
    path = session_file(root)
    _, segs, _ = scan_session_file(path)
    (seg,) = segs
    assert seg.header.block_crcs is not None  # format version 3
    flip_byte(str(path), seg.file_offset + seg.header.layout.block_offset(layer, block) + 5)


def test_a_rotted_byte_inside_a_delivered_block_is_caught(tmp_path: Path) -> None:
    run = Run(tmp_path, geometry(64))
    _rot(tmp_path, 1, PROMPT_BLOCKS - 1)
    invalid, _ = run.partial("next", PROMPT_BLOCKS - 1)
    # The delivered block is reported invalid (the engine recomputes it), never served.
    assert invalid == {LOAD_SLOTS[PROMPT_BLOCKS - 1]}
    (outcome,) = run.outcomes
    assert outcome.done.failed_segments and outcome.done.num_blocks_loaded < PROMPT_BLOCKS
    run.h.close()


def test_a_rotted_byte_in_a_block_the_engine_holds_is_not_read(tmp_path: Path) -> None:
    run = Run(tmp_path, geometry(64))
    _rot(tmp_path, 1, 0)
    invalid, stats = run.partial("next", PROMPT_BLOCKS - 1)
    assert invalid == set() and run.delivered_exact(PROMPT_BLOCKS - 1)
    assert stats["bytes_read_ssd"] == run.g.block_bytes
    # A restore of the whole prompt reads the rotted block and catches it.
    v = view("cold", [*run.toks, 3])
    assert run.h.sched.num_matched_tokens(v, 0) == (PROMPT_BLOCKS * TPB, True)
    run.h.sched.after_alloc("cold", LOAD_SLOTS, PROMPT_BLOCKS * TPB)
    _, _, _, invalid = run.h.step()
    assert invalid == set(LOAD_SLOTS[:PROMPT_BLOCKS])
    run.h.close()

