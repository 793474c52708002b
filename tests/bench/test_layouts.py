"""Baseline layouts: real files, the commands each restore needs, exact bytes back."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
import torch

from flatcake.bench.layouts import ScatteredConfig, write_per_chunk_files, write_scattered
from flatcake.bench.program import ProgramRun, RestoreProgram, run_program, verify_restore
from flatcake.bench.source import empty_kv, make_kv, shifted_table, shuffled_slots
from flatcake.cio.paged import PagedKV
from flatcake.cio.readers import DirectReader

LAYERS, BLOCKS, BBL = 4, 24, 8192


@pytest.fixture
def source() -> list[torch.Tensor]:
    return make_kv(LAYERS, BLOCKS, BBL, seed=3)


def _restore(program: RestoreProgram, source: list[torch.Tensor]
             ) -> tuple[ProgramRun, int, list[torch.Tensor], torch.Tensor]:
    dest = empty_kv(LAYERS, BLOCKS + 5, BBL)
    table = shuffled_slots(BLOCKS, BLOCKS + 5, seed=7)
    reader = DirectReader(4)
    try:
        run = run_program(program, reader, PagedKV(dest, BBL), table)
    finally:
        reader.close()
    return run, verify_restore(dest, source, table), dest, table


def test_make_kv_blocks_are_all_distinct(source: list[torch.Tensor]) -> None:
    rows = torch.cat(source).view(-1, BBL)
    assert torch.unique(rows, dim=0).shape[0] == LAYERS * BLOCKS


def test_scattered_reads_one_command_per_block_per_layer(direct_dir: Path,
                                                          source: list[torch.Tensor]) -> None:
    cfg = ScatteredConfig(num_sessions=3, bucket_keys_limit=50, seed=1)
    program = write_scattered(str(direct_dir / "sc"), source, cfg)
    # Every object of every session is on disk: 3 sessions x 24 blocks x 4 layers.
    objects = 3 * BLOCKS * LAYERS
    files = sorted(os.listdir(direct_dir / "sc"))
    assert len(files) == -(-objects // 50)
    assert program.files_bytes == objects * BBL
    # One pass per layer, one read per block in it, each exactly one object.
    assert len(program.passes) == LAYERS
    assert program.num_commands == BLOCKS * LAYERS
    assert all(r.length == BBL for p in program.passes for r in p.reads)
    # Eviction order spreads a layer's blocks over several buckets.
    assert len({r.path for r in program.passes[0].reads}) > 1
    run, bad, _, _ = _restore(program, source)
    assert bad == 0
    assert (run.read_commands, run.bytes_read) == (BLOCKS * LAYERS, BLOCKS * LAYERS * BBL)


def test_scattered_interleaves_sessions_inside_buckets(direct_dir: Path,
                                                       source: list[torch.Tensor]) -> None:
    program = write_scattered(str(direct_dir / "sc"), source,
                              ScatteredConfig(num_sessions=4, seed=2))
    # One bucket (under Mooncake's 500-key limit) holds 384 objects, a quarter of them
    # the request's: they cannot be contiguous in the file.
    offsets = sorted(r.file_offset for p in program.passes for r in p.reads)
    assert offsets[-1] - offsets[0] > 2 * len(offsets) * BBL
    assert any(b - a > BBL for a, b in itertools.pairwise(offsets))


def test_per_chunk_files_one_read_per_chunk(direct_dir: Path,
                                            source: list[torch.Tensor]) -> None:
    program = write_per_chunk_files(str(direct_dir / "pc"), source, blocks_per_chunk=10)
    # 24 blocks in chunks of 10: 10 + 10 + 4, one file and one read each.
    assert sorted(os.listdir(direct_dir / "pc")) == [f"chunk-{i:06d}.bin" for i in range(3)]
    assert [len(p.reads) for p in program.passes] == [1, 1, 1]
    assert [p.reads[0].length for p in program.passes] == [
        LAYERS * 10 * BBL, LAYERS * 10 * BBL, LAYERS * 4 * BBL]
    assert program.max_staging_bytes == LAYERS * 10 * BBL
    run, bad, _, _ = _restore(program, source)
    assert bad == 0
    assert run.read_commands == 3


def test_verification_catches_a_damaged_file(direct_dir: Path,
                                             source: list[torch.Tensor]) -> None:
    program = write_per_chunk_files(str(direct_dir / "pc"), source, blocks_per_chunk=8)
    path = program.passes[1].reads[0].path
    raw = bytearray(Path(path).read_bytes())
    raw[3 * 8 * BBL + 100] ^= 0xFF  # layer 3 of the chunk, its first block
    Path(path).write_bytes(bytes(raw))
    _, bad, _, _ = _restore(program, source)
    assert bad == 1


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"num_sessions": 0}, "num_sessions"),
    ({"bucket_keys_limit": 0}, "bucket_keys_limit"),
    ({"bucket_size_limit_bytes": 100}, "bucket_size_limit_bytes"),
])
def test_scattered_config_rejects_bad_fields(kwargs: dict[str, int], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ScatteredConfig(**kwargs)


def test_per_chunk_rejects_empty_chunks(direct_dir: Path, source: list[torch.Tensor]) -> None:
    with pytest.raises(ValueError, match="blocks_per_chunk"):
        write_per_chunk_files(str(direct_dir), source, blocks_per_chunk=0)


def test_a_skipped_restore_is_caught_without_zeroing(direct_dir: Path,
                                                     source: list[torch.Tensor]) -> None:
    # The bench never zeroes its destination: restore k uses the base table shifted by
    # k, so what restore k-1 left behind can never pass for restore k's bytes.
    program = write_per_chunk_files(str(direct_dir / "pc"), source, blocks_per_chunk=8)
    num_slots = BLOCKS + 5
    base = shuffled_slots(BLOCKS, num_slots, seed=7)
    dest = empty_kv(LAYERS, num_slots, BBL)
    paged = PagedKV(dest, BBL)
    reader = DirectReader(2)
    try:
        first = shifted_table(base, 0, num_slots)
        run_program(program, reader, paged, first)
        assert verify_restore(dest, source, first) == 0
        # Restore 1 "forgets" to read anything: every (block, layer) is caught.
        assert verify_restore(dest, source, shifted_table(base, 1, num_slots)) == \
            LAYERS * BLOCKS
        second = shifted_table(base, 1, num_slots)
        run_program(program, reader, paged, second)
        assert verify_restore(dest, source, second) == 0
    finally:
        reader.close()
    with pytest.raises(ValueError, match="restore index"):
        shifted_table(base, num_slots, num_slots)
