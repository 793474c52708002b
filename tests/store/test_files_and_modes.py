"""On-disk hygiene and I/O modes: 0600 files / 0700 directories, names that never carry
a session id or key, and each io_mode on a tmpfs (/dev/shm) and on a filesystem that
refuses O_DIRECT."""

from __future__ import annotations

import logging
import os
import stat
import tempfile
from pathlib import Path

import pytest

from flatcake.cio.direct import DirectIOProbe, DirectIOUnsupported, probe_direct_io
from flatcake.cio.files import SESSIONS_DIR
from flatcake.store import FlatCakeStore
from tests.store.helpers import (
    SMALL,
    TO_SSD,
    block_bytes,
    empty_kv,
    random_kv,
    session_keys,
    small_config,
)

SHM = Path("/dev/shm")


def _round_trip(store: FlatCakeStore, session_id: str = "s") -> None:
    src = random_kv(SMALL, 6)
    keys = session_keys(7, 6)
    store.store_turn(session_id, keys, src, range(6), TO_SSD)
    dst = empty_kv(SMALL, 6)
    assert store.load(keys, dst, range(6)).num_blocks == 6
    assert all(block_bytes(dst, layer, i, "kv_blocks") == block_bytes(src, layer, i, "kv_blocks")
               for layer in range(SMALL.num_layers) for i in range(6))


def test_modes_and_names(tmp_path: Path) -> None:
    root = tmp_path / "a" / "root"
    old = os.umask(0o022)
    try:
        with FlatCakeStore.open(root, SMALL, small_config()) as store:
            _round_trip(store, session_id="../../etc/passwd\0/tenant:7")
    finally:
        os.umask(old)
    for d in (root.parent, root, root / SESSIONS_DIR):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    files = [p for p in root.rglob("*") if p.is_file()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    names = sorted(p.name for p in files)
    assert names == ["0000000000000000.fcs", "LOCK", "config.json"]
    assert not any("passwd" in str(p) or "etc" in p.name for p in root.rglob("*"))


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm")
@pytest.mark.parametrize("io_mode", ["auto", "direct", "buffered"])
def test_store_on_tmpfs(io_mode: str, caplog: pytest.LogCaptureFixture) -> None:
    supported = probe_direct_io(SHM).supported  # tmpfs has O_DIRECT since Linux 6.6
    caplog.set_level(logging.WARNING)
    with tempfile.TemporaryDirectory(dir=SHM) as root:
        cfg = small_config(f"store.io_mode={io_mode}")
        if io_mode == "direct" and not supported:
            with pytest.raises(DirectIOUnsupported, match="tmpfs"):
                FlatCakeStore.open(root, SMALL, cfg)
            return
        with FlatCakeStore.open(root, SMALL, cfg) as store:
            expected = "direct" if io_mode != "buffered" and supported else "buffered"
            assert store.io_mode == expected
            _round_trip(store)
    buffered_warnings = [r for r in caplog.records if "buffered" in r.getMessage()]
    assert len(buffered_warnings) == (1 if expected == "buffered" else 0)


def test_filesystem_without_odirect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    caplog: pytest.LogCaptureFixture) -> None:
    def refuse(directory: str) -> DirectIOProbe:
        return DirectIOProbe(directory, "overlay", False, "EINVAL: Invalid argument")

    monkeypatch.setattr("flatcake.cio.direct.probe_direct_io", refuse)
    with pytest.raises(DirectIOUnsupported, match=f"{tmp_path}.*overlay"):
        FlatCakeStore.open(tmp_path, SMALL, small_config("store.io_mode=direct"))
    caplog.set_level(logging.WARNING)
    with FlatCakeStore.open(tmp_path, SMALL, small_config("store.io_mode=auto")) as store:
        assert store.io_mode == "buffered"
        _round_trip(store)
    (warning,) = [r for r in caplog.records if "O_DIRECT" in r.getMessage()]
    assert "overlay" in warning.getMessage() and "buffered" in warning.getMessage()
