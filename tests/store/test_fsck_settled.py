"""``flatcake fsck`` tells damage the store has settled from damage it has not: it exits 1
only while a live file still holds damage, and 0 once the store (at open, while serving,
or ``fsck --repair``) has cut the file or quarantined it, listing the quarantined files
as settled. Real stores, real bytes corrupted, the real command line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from flatcake.cio.files import QUARANTINE_DIR, SESSIONS_DIR
from flatcake.cio.filescan import ScannedSegment, scan_session_file
from flatcake.cli import main
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

REPO = Path(__file__).resolve().parents[2]
TURNS = [4, 3, 5]  # blocks per turn; request blocks [0,4) [4,7) [7,12)
N = sum(TURNS)


def _write(root: Path, sessions: dict[str, int]) -> tuple[list[torch.Tensor], dict[str, Path]]:
    """Each session ``name: num_turns`` in its own file; returns the files by session."""
    src = random_kv(SMALL, N, seed=3)
    with FlatCakeStore.open(root, SMALL, small_config()) as store:
        for s, (sid, num_turns) in enumerate(sessions.items()):
            done = 0
            for n in TURNS[:num_turns]:
                done += n
                store.store_turn(sid, session_keys(s, N)[:done], src, range(done), TO_SSD)
    by_session = {scan_session_file(p)[0].session_id: p
                  for p in (root / SESSIONS_DIR).iterdir()}
    assert sorted(by_session) == sorted(sessions)
    return src, by_session


def _segments(path: Path) -> list[ScannedSegment]:
    _, segs, bad = scan_session_file(path)
    assert bad == []
    return segs


def _damage_at(path: Path) -> int:
    """Where a scan of ``path`` stops (the damaged segment's offset)."""
    _, _, bad = scan_session_file(path)
    return bad[0].file_offset


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0x10]))


def _fsck(capsys: pytest.CaptureFixture[str], root: Path, *flags: str) -> tuple[int, str]:
    code = main(["fsck", str(root), *flags])
    return code, capsys.readouterr().out


def _fsck_json(capsys: pytest.CaptureFixture[str], root: Path,
               *flags: str) -> tuple[int, dict[str, Any]]:
    code, out = _fsck(capsys, root, "--json", *flags)
    return code, json.loads(out)


def _states(report: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """File name -> (state, action) from fsck's JSON."""
    return {Path(f["path"]).name: (f["state"], f["action"]) for f in report["files"]}


def _served(store: FlatCakeStore, s: int, src: list[torch.Tensor]) -> int:
    """Blocks of session ``s`` restored, each checked byte for byte."""
    dst = empty_kv(SMALL, N)
    res = store.load(session_keys(s, N), dst, range(N))
    for layer in range(SMALL.num_layers):
        for i in range(res.num_blocks):
            assert block_bytes(dst, layer, i, "kv_blocks") == block_bytes(src, layer, i,
                                                                           "kv_blocks")
    return res.num_blocks


def test_damage_settled_at_open_no_longer_fails_fsck(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, files = _write(tmp_path, {"a": 3, "b": 3})
    a, b = files["a"], files["b"]
    _flip(a, 10)  # a's file header: the whole file is unusable
    _flip(b, _segments(b)[1].file_offset + 40)  # b's turn 2 header: b is cut before it

    # 1. Nobody has settled anything yet: fsck fails and says what --repair would do.
    code, report = _fsck_json(capsys, tmp_path)
    assert code == 1 and report["ok"] is False and report["clean"] is False
    assert _states(report) == {a.name: ("damaged", "quarantine"), b.name: ("damaged", "cut")}
    assert (report["num_ok"], report["num_settled"], report["num_damaged"]) == (0, 0, 2)
    code, out = _fsck(capsys, tmp_path)
    assert code == 1
    assert f"DAMAGED  {a}: file header damaged: " in out
    assert "not settled: --repair moves it to quarantine/" in out
    assert f"DAMAGED  {b}: segment at offset {_damage_at(b)}" in out
    assert "not settled: --repair cuts the file after its last valid segment" in out
    assert "2 files: 0 ok, 0 settled (quarantined), 2 damaged and not settled" in out
    assert "run flatcake fsck --repair" in out

    # 2. The store opens (a quarantined, b cut after turn 1), closes, opens again.
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert (store.recovery.damaged_files, store.recovery.damaged_segments) == (1, 1)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert (store.recovery.damaged_files, store.recovery.damaged_segments) == (0, 0)
        assert _served(store, 0, src) == 0 and _served(store, 1, src) == TURNS[0]
    quarantined = tmp_path / QUARANTINE_DIR / a.name
    assert quarantined.exists() and not a.exists()

    # 3. Everything left is clean or settled: exit 0, the quarantined file listed.
    code, report = _fsck_json(capsys, tmp_path)
    assert code == 0 and report["ok"] is True and report["clean"] is False
    assert _states(report) == {b.name: ("ok", ""), a.name: ("settled", "quarantined")}
    (q,) = [f for f in report["files"] if f["settled"]]
    assert q["path"] == str(quarantined) and q["problem"].startswith("file header damaged")
    assert not q["needs_repair"]
    code, out = _fsck(capsys, tmp_path)
    assert code == 0 and "DAMAGED" not in out
    assert f"ok       {b}: 1 segments, {TURNS[0]} blocks" in out
    assert f"settled  {quarantined}: quarantined (file header damaged: " in out
    assert "out of service, never read again, kept for inspection" in out
    assert "2 files: 1 ok, 1 settled (quarantined), 0 damaged and not settled" in out
    assert "nothing left to settle" in out

    # 4. --repair has nothing left to do, and fsck stays at 0.
    code, report = _fsck_json(capsys, tmp_path, "--repair")
    assert code == 0 and report["ok"] is True
    assert report["repair"] == {"num_files": 1, "quarantined": 0, "cut": 0, "deleted": 0,
                                "damaged_segments": 0, "lost_segments": 0,
                                "quarantined_paths": [], "cut_paths": [],
                                "deleted_paths": []}

    # 5. inspect (headers only) draws the same line.
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"quarantined (settled, out of service): {quarantined}" in out
    assert "damaged, not settled" not in out


def test_damage_found_while_serving_is_settled_by_the_cut(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, files = _write(tmp_path, {"s": 3})
    path = files["s"]
    segs = _segments(path)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert _served(store, 0, src) == N
        # Turn 2's data rots while the store serves: its headers still look fine.
        _flip(path, segs[1].file_offset + segs[1].header.layout.block_offset(1, 1))
        code, report = _fsck_json(capsys, tmp_path)
        assert code == 1 and _states(report) == {path.name: ("damaged", "cut")}
        assert "layer 1 crc32 mismatch" in report["files"][0]["problem"]
        # The next restore finds it: a miss from turn 2 on, the session cut there.
        assert _served(store, 0, src) == TURNS[0]
        assert _served(store, 0, src) == TURNS[0]
        assert path.stat().st_size == segs[0].end_offset
        code, report = _fsck_json(capsys, tmp_path)  # the store still serves
        assert code == 0 and report["clean"] is True
        assert _states(report) == {path.name: ("ok", "")}
        # The cut file looks clean: damage.log is its only trace, and fsck lists it.
        (entry,) = report["settled_earlier"]
        assert (entry["action"], entry["file"], entry["end_bytes"]) == (
            "cut", path.name, segs[0].end_offset)
        assert "restore" in entry["why"]
    code, out = _fsck(capsys, tmp_path)
    assert code == 0 and "1 files: 1 ok, 0 settled (quarantined), 0 damaged" in out
    assert "settled earlier (1 in damage.log, newest last):" in out
    assert f"cut        {path.name} at byte {segs[0].end_offset}: damaged segment" in out
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert store.recovery.damaged_segments == 0
        assert _served(store, 0, src) == TURNS[0]


def test_header_damage_found_while_serving_is_settled_by_quarantine(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, files = _write(tmp_path, {"s": 3})
    path = files["s"]
    segs = _segments(path)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        _flip(path, 10)
        _flip(path, segs[2].file_offset + segs[2].header.layout.block_offset(1, 1))
        assert _served(store, 0, src) == TURNS[0] + TURNS[1]
        assert (tmp_path / QUARANTINE_DIR / path.name).exists()
        code, report = _fsck_json(capsys, tmp_path)
        assert code == 0 and _states(report) == {path.name: ("settled", "quarantined")}
        assert [(e["action"], e["file"]) for e in report["settled_earlier"]] == [
            ("quarantine", path.name)]
    code, out = _fsck(capsys, tmp_path)
    assert code == 0 and "1 settled (quarantined), 0 damaged" in out


def test_repair_settles_what_the_store_has_not(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, files = _write(tmp_path, {"a": 3, "b": 3, "c": 1})
    a, b, c = files["a"], files["b"], files["c"]
    stray = tmp_path / SESSIONS_DIR / "00000000000000aa.fcs"
    shutil.copy(b, stray)  # a stray: its header names b's file id
    _flip(a, 10)  # unreadable file header -> quarantine
    segs = _segments(b)
    _flip(b, segs[2].file_offset + segs[2].header.layout.block_offset(1, 1))  # -> cut
    _flip(c, _segments(c)[0].file_offset + 40)  # c's only turn -> deleted

    code, report = _fsck_json(capsys, tmp_path)
    assert code == 1
    assert _states(report) == {a.name: ("damaged", "quarantine"), b.name: ("damaged", "cut"),
                               c.name: ("damaged", "delete"),
                               stray.name: ("damaged", "quarantine")}
    (s,) = [f for f in report["files"] if f["stray"]]
    assert s["problem"] == f"a stray: its header names file id {int(b.stem, 16)}"

    code, report = _fsck_json(capsys, tmp_path, "--repair")
    assert code == 0 and report["ok"] is True
    rep = report["repair"]
    assert (rep["quarantined"], rep["cut"], rep["deleted"]) == (2, 1, 1)
    assert sorted(rep["quarantined_paths"]) == sorted(
        str(tmp_path / QUARANTINE_DIR / p.name) for p in (a, stray))
    assert (rep["cut_paths"], rep["deleted_paths"]) == ([str(b)], [str(c)])
    assert _states(report) == {b.name: ("ok", ""), a.name: ("settled", "quarantined"),
                               stray.name: ("settled", "quarantined")}
    assert sorted((e["action"], e["file"]) for e in report["settled_earlier"]) == sorted(
        [("quarantine", a.name), ("quarantine", stray.name), ("cut", b.name),
         ("delete", c.name)])

    code, out = _fsck(capsys, tmp_path)
    assert code == 0 and "DAMAGED" not in out
    assert "3 files: 1 ok, 2 settled (quarantined), 0 damaged and not settled" in out
    assert f"settled  {tmp_path / QUARANTINE_DIR / stray.name}: quarantined (a stray: " in out
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert (store.recovery.damaged_files, store.recovery.damaged_segments) == (0, 0)
        assert _served(store, 1, src) == TURNS[0] + TURNS[1]


def test_repair_prints_what_it_settled(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    _, files = _write(tmp_path, {"s": 3})
    path = files["s"]
    _flip(path, _segments(path)[1].file_offset + 40)
    code, out = _fsck(capsys, tmp_path, "--repair")
    assert code == 0
    assert "repaired 1 files: 1 cut after their last valid segment" in out
    assert f"  cut         {path}" in out
    assert f"ok       {path}: 1 segments, {TURNS[0]} blocks" in out


@pytest.mark.parametrize("flags", [[], ["--json"], ["--repair"]])
@pytest.mark.parametrize("what", ["missing", "a file", "not a store"])
def test_a_wrong_root_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          flags: list[str], what: str) -> None:
    root = tmp_path / "root"
    if what == "a file":
        root.write_text("not a store")
    elif what == "not a store":
        root.mkdir()
        (root / "notes.txt").write_text("hello")
    assert main(["fsck", str(root), *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("flatcake fsck: error: ")
    assert captured.err.count("\n") == 1


def test_the_installed_command_tells_settled_from_unsettled(tmp_path: Path) -> None:
    """``python -m flatcake.cli fsck``: exit 1 before the store settles a damaged header,
    0 after, and a user's mistake is one line on stderr, never a traceback."""
    _, files = _write(tmp_path, {"s": 1})
    _flip(files["s"], 10)
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}

    def fsck(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "flatcake.cli", "fsck", *args], env=env,
                              cwd=REPO, capture_output=True, text=True, timeout=120)

    before = fsck(str(tmp_path))
    assert before.returncode == 1 and "DAMAGED" in before.stdout, before.stderr
    with FlatCakeStore.open(tmp_path, SMALL, small_config()):
        pass
    done = fsck(str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "quarantined (file header damaged" in done.stdout
    wrong = fsck(str(tmp_path / "nope"))
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
    assert "does not exist" in wrong.stderr
