"""A store closing while a restore hangs on the disk: the wait for it is bounded, and
the restore ends as a miss (nothing of it is reported loaded, before or after its late
reads end), and its fence keeps every late byte out of the caller's KV."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from flatcake.store import FlatCakeStore
from tests.cio.helpers import HungDisk
from tests.store.helpers import SMALL, TO_SSD, empty_kv, random_kv, session_keys, small_config


def test_close_gives_up_on_a_hung_restore_at_its_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    keys = session_keys(1, 4)
    store = FlatCakeStore.open(tmp_path, SMALL, small_config())
    assert store.store_turn("s", keys, random_kv(SMALL, 8), range(4), TO_SSD).num_blocks == 4
    disk = HungDisk(monkeypatch)
    kv = empty_kv(SMALL, 8)  # 256 B blocks: the staging path, a scatter per layer
    handle = store.start_load(keys, kv, range(4))
    closer = threading.Thread(target=store.close, kwargs={"timeout_s": 0.3})
    try:
        assert disk.entered.wait(10)
        with caplog.at_level(logging.WARNING, "flatcake.store.store"):
            closer.start()
            closer.join(10)
        assert not closer.is_alive()  # without a deadline it waits for the hung read
        assert "closed with 1 restores unfinished" in caplog.text
        assert handle.wait(5).num_blocks == 0
        with pytest.raises(RuntimeError):
            handle.wait_for_layer(0, 5)
    finally:
        disk.release()
        closer.join(10)
    deadline = time.monotonic() + 10
    while not disk.late_reads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert disk.late_reads > 0 and handle.wait(5).num_blocks == 0  # never reported late
    assert store._exec._in_flight.wait(10) == 0  # the late restore has ended
    # Its late layers were read, but none was copied into the caller's tensors.
    assert all(int(t.count_nonzero()) == 0 for t in kv)
