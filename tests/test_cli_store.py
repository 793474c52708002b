"""``flatcake demo``, ``flatcake inspect`` and ``flatcake fsck`` on real store roots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flatcake.cio.files import SESSIONS_DIR
from flatcake.cio.filescan import scan_session_file
from flatcake.cli import main
from flatcake.store import FlatCakeStore
from tests.store.helpers import (
    SMALL,
    THREE_KINDS,
    TO_MEMORY,
    TO_SSD,
    paged,
    random_kv,
    session_keys,
    small_config,
    store_three_turns,
)

# Segment bytes on SSD: a 4 KiB header + 3 layers x 256 B per block, 4 KiB aligned.
SMALL_SEGMENT_BYTES = {n: 4096 + -(-(n * 3 * 256) // 4096) * 4096 for n in (4, 8)}
SIZES = ["--set", "store.memory_capacity_bytes=4194304",
         "--set", "store.ssd_capacity_bytes=268435456"]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    src = random_kv(SMALL, 12)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        for s in range(2):
            keys = session_keys(s, 12)
            store.store_turn(f"chat-{s}", keys[:8], src, range(8), TO_SSD)
            store.store_turn(f"chat-{s}", keys, src, range(12), TO_SSD)
            # One more block in host memory: not persistent, so not on disk.
            store.store_turn(f"chat-{s}", keys + session_keys(9, 1), src,
                             [*range(12), 0], TO_MEMORY)
    return tmp_path


def test_inspect_json(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(root), "--json", *SIZES]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [s["session_id"] for s in report["sessions"]] == ["chat-0", "chat-1"]
    assert all(s["segments"] == 2 and s["blocks"] == 12 for s in report["sessions"])
    ssd = report["media"]["ssd"]
    assert ssd["files"] == 2 and ssd["capacity_bytes"] == 268435456
    assert ssd["high"] == 0.9 and ssd["low"] == 0.8
    # Two files, each: file header + an 8-block and a 4-block segment.
    per_file = 4096 + sum(SMALL_SEGMENT_BYTES[n] for n in (8, 4))
    assert ssd["used_bytes"] == 2 * per_file
    assert report["media"]["memory"]["used_bytes"] == 0  # memory is not persistent
    assert report["damaged_files"] == []
    assert report["host_buffers"].startswith("host buffers >= 2 MiB: 2 MiB-aligned")


def test_inspect_text(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(root)]) == 0
    out = capsys.readouterr().out
    assert "2 sessions" in out and "'chat-0': 2 segments, 12 blocks" in out
    assert "reclaim above 90% down to 80%" in out
    assert "kernel THP mode:" in out


def test_fsck_exit_codes(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fsck", str(root)]) == 0
    assert "2 files: 2 ok, 0 settled (quarantined), 0 damaged" in capsys.readouterr().out
    path = sorted((root / SESSIONS_DIR).iterdir())[1]
    _, segs, _ = scan_session_file(path)
    with open(path, "r+b") as fh:
        at = segs[1].file_offset + segs[1].header.layout.data_offset + 5
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 1]))
    assert main(["fsck", str(root)]) == 1
    out = capsys.readouterr().out
    assert "DAMAGED" in out and "layer 0 crc32 mismatch" in out
    assert "1 damaged and not settled" in out and "fsck --repair" in out
    assert main(["fsck", str(root), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and [f["ok"] for f in report["files"]] == [True, False]
    assert [f["state"] for f in report["files"]] == ["ok", "damaged"]


def test_missing_root_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fsck", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_demo_refuses_no_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--nodes", "0"]) == 2
    assert "--nodes must be >= 1" in capsys.readouterr().err


def test_demo_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Every rule the demo's turns can hit, and every restore read from its home.
    code = main(["demo", "--layers", "4", "--first-tokens", "256", "--turn-tokens", "64",
                 "--turns", "4", "--root", str(tmp_path / "demo"),
                 "--set", "placement.short_reply_threshold_tokens=512",
                 "--set", "placement.memory_copy_watermark=0"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "verify: bytes equal" in out
    assert "by first_turn" in out and "by short_reply" in out and "by long_reply" in out
    assert "restore: 28 of 28 blocks (24 ssd, 4 memory)" in out
    assert main(["fsck", str(tmp_path / "demo")]) == 0
    # The defaults: every turn homed on SSD, every restore from its memory copy.
    code = main(["demo", "--layers", "4", "--first-tokens", "256", "--turn-tokens", "64",
                 "--turns", "4", "--root", str(tmp_path / "demo-defaults")])
    out = capsys.readouterr().out
    assert code == 0 and "verify: bytes equal" in out
    assert "-> memory" not in out and "restore: 28 of 28 blocks (0 ssd, 28 memory)" in out


def test_inspect_shows_the_budgets_the_store_recorded(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The store wrote ROOT/config.json when it opened; inspect reads its budgets,
    not the CLI's defaults; explicit --set still wins."""
    from flatcake.store.record import RECORD_NAME, read_record

    rec = read_record(root)
    assert rec is not None and rec.config == small_config() and rec.geometry == SMALL
    assert (root / RECORD_NAME).stat().st_mode & 0o777 == 0o600
    assert main(["inspect", str(root), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config_source"].startswith("recorded by the store at ")
    cap = small_config().store.memory_capacity_bytes
    assert report["media"]["memory"]["capacity_bytes"] == cap != 4 * 2**30
    assert report["geometry"]["num_layers"] == SMALL.num_layers
    assert main(["inspect", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"of {cap / 2**20:.1f} MiB" in out and "config: recorded by the store" in out
    assert main(["inspect", str(root), "--json", *SIZES]) == 0
    given = json.loads(capsys.readouterr().out)
    assert given["config_source"] == "given"
    assert given["media"]["ssd"]["capacity_bytes"] == 268435456


def test_inspect_without_a_record_says_it_uses_defaults(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flatcake.store.record import RECORD_NAME

    (root / RECORD_NAME).unlink()
    assert main(["inspect", str(root), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config_source"] == "defaults (the store recorded no config)"
    (root / RECORD_NAME).write_text("{not json")
    assert main(["inspect", str(root)]) == 2
    assert "unreadable store config record" in capsys.readouterr().err


def test_a_record_that_cannot_be_written_does_not_stop_the_store(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from flatcake.store.record import RECORD_NAME

    (tmp_path / RECORD_NAME).mkdir()  # os.replace onto a directory fails
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert store.lookup(session_keys(0, 2)).num_blocks == 0
    assert "cannot record the store config" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LOCK", RECORD_NAME, "sessions"]


def test_inspect_names_each_layer_kind(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    src = paged(THREE_KINDS, 12, seed=3)
    with FlatCakeStore.open(tmp_path, THREE_KINDS, small_config()) as store:
        store_three_turns(store, session_keys(3, 12, THREE_KINDS), src)
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "geometry: three-kinds, 5 layers, 16 tokens per block" in out
    assert "    2 full layers: 512 B per 1 tokens\n" in out
    assert "    1 c4a layers: 1024 B per 4 tokens\n" in out
    assert "    2 c16 layers: 584 B per 16 tokens\n" in out
