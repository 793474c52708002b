"""One scenario per defect a production operator found (issue 12), each failing on the
code before its fix: the store must survive the fault, serve no wrong byte, lose no
acknowledged turn without saying so, and reopen."""

from __future__ import annotations

import errno
import gzip
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flatcake.cio.files import QUARANTINE_DIR, SESSIONS_DIR
from flatcake.cio.filescan import scan_session_file
from flatcake.cli import main
from flatcake.config import load_config
from flatcake.geometry import KVGeometry
from flatcake.store import FlatCakeStore, fsck_root
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


def _files(root: Path) -> list[Path]:
    return sorted((root / SESSIONS_DIR).glob("*.fcs"))


def _assert_prefix(store: FlatCakeStore, keys: list[bytes], src: list, expected: int) -> None:
    n = len(keys)
    dst = empty_kv(SMALL, n)
    res = store.load(keys, dst, range(n))
    assert res.num_blocks == expected
    for layer in range(SMALL.num_layers):
        for i in range(expected):
            assert block_bytes(dst, layer, i, "kv_blocks") == block_bytes(src, layer, i,
                                                                           "kv_blocks")


def _disk_bytes(root: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


# 1 ------------------------------------------------------------------------------------
def test_repeated_key_in_one_turn_is_refused_before_anything_is_written(
        tmp_path: Path) -> None:
    src = random_kv(SMALL, 8)
    keys = session_keys(1, 4)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        with pytest.raises(ValueError, match=r"keys\[3\] repeats keys\[1\]"):
            store.store_turn("s", [*keys[:3], keys[1]], src, range(4), TO_SSD)
        assert store.control.stats().ssd_used_bytes == 0
        store.store_turn("s", keys, src, range(4), TO_SSD)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert store.recovery.num_segments == 1
        _assert_prefix(store, keys, src, 4)


# 2 ------------------------------------------------------------------------------------
def test_a_file_id_is_never_handed_out_twice_after_a_crash(tmp_path: Path) -> None:
    src = random_kv(SMALL, 8)
    a, b = session_keys(1, 4), session_keys(2, 4)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        store.store_turn("a", a, src, range(4), TO_SSD)
    (path,) = _files(tmp_path)
    os.truncate(path, 4096)  # the header landed, the first segment did not
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert store.store_turn("b", b, src, range(4), TO_SSD).num_blocks == 4
        store.store_turn("a", a, src, range(4), TO_SSD)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        ids = {s["session_id"]: s["files"] for s in store.inspect()["sessions"]}
        assert set(ids) == {"a", "b"} and not set(ids["a"]) & set(ids["b"])
        store.drop_session("a")
        _assert_prefix(store, b, src, 4)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        _assert_prefix(store, b, src, 4)
        assert store.lookup(a).num_blocks == 0


# 3 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad_id", ["x" * 3000, "lone \udc80 surrogate"])
def test_bad_session_id_is_refused_up_front(tmp_path: Path, bad_id: str) -> None:
    src = random_kv(SMALL, 8)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        with pytest.raises(ValueError, match="session_id"):
            store.store_turn(bad_id, session_keys(1, 4), src, range(4), TO_SSD)
        assert store.control.stats().ssd_used_bytes == 0
        assert _files(tmp_path) == []


def test_failed_file_creation_leaves_the_session_usable(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    src = random_kv(SMALL, 8)
    keys = session_keys(1, 8)

    def no_space(*_args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        with monkeypatch.context() as m:
            m.setattr("flatcake.cio.files.write_file_header", no_space)
            res = store.store_turn("s", keys[:4], src, range(4), TO_SSD)
        assert res.num_blocks == 0 and "No space" in res.error
        assert store.control.stats().ssd_used_bytes == 0 and _files(tmp_path) == []
        assert store.store_turn("s", keys[:4], src, range(4), TO_SSD).num_blocks == 4
        assert store.store_turn("s", keys, src, range(8), TO_SSD).num_blocks == 4
        store.control.check_integrity()
        assert store.control.stats().ssd_used_bytes == 4096 + 2 * 8192
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        _assert_prefix(store, keys, src, 8)


# 4 ------------------------------------------------------------------------------------
def test_torn_tail_in_a_merged_read_hides_only_the_torn_turn(tmp_path: Path) -> None:
    src = random_kv(SMALL, 12)
    keys = session_keys(1, 12)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        for end in (4, 8, 12):  # three small neighbouring segments: one merged read
            store.store_turn("s", keys[:end], src, range(end), TO_SSD)
        (path,) = _files(tmp_path)
        _, segs, _ = scan_session_file(path)
        os.truncate(path, segs[2].file_offset + 4096 + 512)  # the last turn is torn
        for _ in range(2):
            dst = empty_kv(SMALL, 12)
            res = store.load(keys, dst, range(12))
            assert res.num_blocks == 8
            for layer in range(SMALL.num_layers):
                for i in range(8):
                    assert block_bytes(dst, layer, i, "kv_blocks") == block_bytes(
                        src, layer, i, "kv_blocks")
            # The torn turn is no longer promised.
            assert store.lookup(keys).num_blocks == 8
        store.control.check_integrity()


# 5 ------------------------------------------------------------------------------------
def test_zeroed_segment_header_is_damage_not_the_end_of_the_file(tmp_path: Path) -> None:
    src = random_kv(SMALL, 12)
    keys = session_keys(1, 12)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        for end in (4, 8, 12):
            store.store_turn("s", keys[:end], src, range(end), TO_SSD)
    (path,) = _files(tmp_path)
    _, segs, _ = scan_session_file(path)
    with open(path, "r+b") as fh:
        fh.seek(segs[1].file_offset)
        fh.write(bytes(4096))
    _, ok, bad = scan_session_file(path)
    assert len(ok) == 1 and bad and "followed by" in bad[0].reason
    assert not fsck_root(tmp_path).ok
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert store.recovery.damaged_segments >= 1
        assert store.recovery.lost_segments == 1  # turn 2 was intact but is cut off
        _assert_prefix(store, keys, src, 4)
    assert fsck_root(tmp_path).ok  # the store cut the file at the damage


# 6 ------------------------------------------------------------------------------------
def test_ssd_budget_bounds_the_bytes_on_disk(tmp_path: Path) -> None:
    src = random_kv(SMALL, 8)
    cfg = small_config("store.ssd_capacity_bytes=8388608")
    with FlatCakeStore.open(tmp_path, SMALL, cfg) as store:
        for s in range(10):
            store.store_turn(f"s{s}", session_keys(s, 4), src, range(4), TO_SSD)
        used = store.control.stats().ssd_used_bytes
    files = _files(tmp_path)
    assert len(files) == 10
    assert _disk_bytes(tmp_path / SESSIONS_DIR) <= used <= 8388608


def test_enospc_on_a_write_is_a_clean_miss(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    src = random_kv(SMALL, 8)
    keys = session_keys(1, 8)
    real, real_v = os.pwrite, os.pwritev

    def full(fd: int, data: object, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        store.store_turn("s", keys[:4], src, range(4), TO_SSD)
        used = store.control.stats().ssd_used_bytes
        monkeypatch.setattr("flatcake.cio.direct.os.pwrite", full)
        monkeypatch.setattr("flatcake.cio.direct.os.pwritev", full)  # zero-copy writes
        res = store.store_turn("s", keys, src, range(8), TO_SSD)
        assert res.num_blocks == 0 and res.medium is None and "No space" in res.error
        assert store.lookup(keys).num_blocks == 4
        assert store.control.stats().ssd_used_bytes == used
        monkeypatch.setattr("flatcake.cio.direct.os.pwrite", real)
        monkeypatch.setattr("flatcake.cio.direct.os.pwritev", real_v)
        assert store.store_turn("s", keys, src, range(8), TO_SSD).num_blocks == 4
        store.control.check_integrity()
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert store.recovery.damaged_segments == 0
        _assert_prefix(store, keys, src, 8)


# 7 ------------------------------------------------------------------------------------
def test_crash_while_creating_a_file_leaves_a_clean_store(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import os
        import flatcake.cio.files as files
        from tests.store.helpers import SMALL, TO_SSD, random_kv, session_keys, small_config
        from flatcake.store import FlatCakeStore

        def crash(fd, header):
            with open(os.readlink(f"/proc/self/fd/{{fd}}"), "r+b") as fh:
                fh.write(b"FLCKFILE" + bytes(100))  # half a header, then the kill
            os._exit(9)

        files.write_file_header = crash
        store = FlatCakeStore.open({str(tmp_path)!r}, SMALL, small_config())
        store.store_turn("s", session_keys(1, 4), random_kv(SMALL, 4), range(4), TO_SSD)
    """)
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, timeout=120)
    assert proc.returncode == 9
    assert fsck_root(tmp_path).ok
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert store.recovery.damaged_files == 0
        assert store.store_turn("s", session_keys(1, 4), random_kv(SMALL, 4), range(4),
                                TO_SSD).num_blocks == 4
    assert fsck_root(tmp_path).ok
    assert [p.name for p in (tmp_path / SESSIONS_DIR).iterdir()] == [
        p.name for p in _files(tmp_path)]  # no temp file left behind


# 8 ------------------------------------------------------------------------------------
def test_stray_session_file_is_quarantined_not_fatal(tmp_path: Path) -> None:
    src = random_kv(SMALL, 8)
    mine, other = tmp_path / "mine", tmp_path / "other"
    for root, s in ((mine, 1), (other, 2)):
        with FlatCakeStore.open(root, SMALL, small_config()) as store:
            store.store_turn(f"s{s}", session_keys(s, 4), src, range(4), TO_SSD)
    (stray,) = _files(other)
    shutil.copy(stray, mine / SESSIONS_DIR / "00000000000000aa.fcs")  # file id mismatch
    with FlatCakeStore.open(mine, SMALL, small_config()) as store:
        assert store.recovery.damaged_files == 1
        _assert_prefix(store, session_keys(1, 4), src, 4)
        assert store.lookup(session_keys(2, 4)).num_blocks == 0
    assert (mine / QUARANTINE_DIR / "00000000000000aa.fcs").exists()


# 9 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("override, field", [
    ("scheduler.max_restores_in_flight=1.5", "scheduler.max_restores_in_flight"),
    ("store.read_threads=2.5", "store.read_threads"),
    ("store.node_id=true", "store.node_id"),
])
def test_config_values_of_the_wrong_type_name_the_field(override: str, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        load_config(env={}, overrides=[override])


def test_config_values_of_the_wrong_type_from_toml(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    for body, field in (("[store]\nsession_file_bytes = 1048576.0\n", "session_file_bytes"),
                        ("[store]\nnode_id = true\n", "node_id"),
                        ("[store]\nroot = 5\n", "root"),
                        ("[scheduler]\nmax_restores_in_flight = 1.5\n",
                         "max_restores_in_flight")):
        toml.write_text(body)
        with pytest.raises(ValueError, match=field):
            load_config(toml, env={})


@pytest.mark.parametrize("kwargs, field", [
    ({"num_kv_heads": 2.5}, "num_kv_heads"),
    ({"num_layers": True}, "num_layers"),
    ({"head_dim": "8"}, "head_dim"),
])
def test_geometry_values_of_the_wrong_type_name_the_field(kwargs: dict[str, object],
                                                          field: str) -> None:
    base: dict[str, object] = {"num_layers": 2, "tokens_per_block": 4, "num_kv_heads": 2,
                               "head_dim": 8}
    with pytest.raises(ValueError, match=field):
        KVGeometry(**{**base, **kwargs})  # type: ignore[arg-type]


# 10 -----------------------------------------------------------------------------------
def test_existing_root_with_loose_permissions_is_tightened(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    os.chmod(root, 0o777)
    with FlatCakeStore.open(root, SMALL, small_config()):
        pass
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


# 11 -----------------------------------------------------------------------------------
def test_root_that_is_a_regular_file_is_a_clear_error(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    plain = tmp_path / "plain"
    plain.write_text("not a directory")
    with pytest.raises(ValueError, match="not a directory"):
        FlatCakeStore.open(plain, SMALL, small_config())
    assert main(["demo", "--root", str(plain)]) == 2
    assert "not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["fsck", "inspect"])
def test_fsck_and_inspect_on_a_directory_that_is_not_a_store(
        tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    assert main([command, str(tmp_path)]) == 2
    assert "not a FlatCake store" in capsys.readouterr().err


def test_truncated_gzip_trace_is_a_one_line_error(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    lines = "".join(f'{{"timestamp": {i}, "input_length": 1024, "output_length": 8, '
                    f'"hash_ids": [{i}, {i + 1}]}}\n' for i in range(2000))
    raw = gzip.compress(lines.encode())
    path = tmp_path / "trace.jsonl.gz"
    path.write_bytes(raw[:len(raw) // 2])
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err
    assert "truncated or corrupt" in err and "Traceback" not in err


# fsck --repair -------------------------------------------------------------------------
def test_fsck_repair_leaves_a_clean_store(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    src = random_kv(SMALL, 12)
    keys = session_keys(1, 12)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        for end in (4, 8, 12):
            store.store_turn("s", keys[:end], src, range(end), TO_SSD)
        store.store_turn("t", session_keys(2, 4), src, range(4), TO_SSD)
    path, other = _files(tmp_path)
    _, segs, _ = scan_session_file(path)
    with open(path, "r+b") as fh:  # zero turn 1's header page: turn 2 is cut off too
        fh.seek(segs[1].file_offset)
        fh.write(bytes(4096))
    with open(other, "r+b") as fh:  # a damaged file header
        fh.write(b"XXXX")
    (tmp_path / SESSIONS_DIR / ".00000000000000ff.fcs.tmp").write_bytes(b"half")
    assert main(["fsck", str(tmp_path)]) == 1
    capsys.readouterr()
    assert main(["fsck", "--repair", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1 cut after their last valid segment (1 damaged segments, 1 valid" in out
    assert "1 quarantined" in out
    assert not list((tmp_path / SESSIONS_DIR).glob(".*"))
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert store.recovery.damaged_segments == 0 and store.recovery.damaged_files == 0
        _assert_prefix(store, keys, src, 4)
    with FlatCakeStore.open(tmp_path, SMALL, small_config()) as store:
        assert main(["fsck", "--repair", str(tmp_path)]) == 2  # a store serves it
    assert "already open" in capsys.readouterr().err
