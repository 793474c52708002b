"""The checksums beside the reads: ``crc_views`` and the ``PieceCrcs`` hand-off from a
reader thread to the restore thread."""

from __future__ import annotations

import threading
import zlib

import pytest

from flatcake.cio.crc import PieceCrcs, crc_views


def test_crc_views_is_the_crc32_of_the_views_concatenated() -> None:
    data = bytes(range(256)) * 1000
    views = [memoryview(data)[a:b] for a, b in ((0, 65536), (65536, 70000), (70000, 256000))]
    assert crc_views(views) == zlib.crc32(data)
    assert crc_views([]) == 0


def test_piece_crcs_hand_over_from_another_thread() -> None:
    crcs = PieceCrcs()
    got: list[dict[tuple[int, int], int]] = []
    waiter = threading.Thread(target=lambda: got.append(crcs.result()))
    waiter.start()
    waiter.join(0.05)
    assert waiter.is_alive()  # nothing set yet: the restore thread waits
    crcs.set_result({(0, 4096): 7})
    waiter.join(5)
    assert got == [{(0, 4096): 7}]
    assert crcs.result() == {(0, 4096): 7}  # and again


def test_piece_crcs_raise_the_reads_error() -> None:
    crcs = PieceCrcs()
    crcs.set_exception(OSError(5, "Input/output error"))
    for _ in range(2):
        with pytest.raises(OSError, match="Input/output"):
            crcs.result()
