"""Paths another user can plant before the node service starts: its socket directory,
its socket and its shared arena file. The service refuses each by name (never follows,
adopts nor removes it) and leaves the root free; a client refuses a socket, or a
listener, of another user before it sends or reads a byte.

The tests run as root here: "another user" is uid 12345 (``os.chown`` on files made in
``tmp_path``, a forked listener that ``setuid``s)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from flatcake.config import FlatCakeConfig, load_config
from flatcake.link import trust, verbs
from flatcake.link.client import NodeClient
from flatcake.service.arena import arena_path
from flatcake.service.server import NodeService

OTHER_UID = 12345  # no such user here
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def config(tmp_path: Path) -> FlatCakeConfig:
    (tmp_path / "shm").mkdir(exist_ok=True)
    return load_config(env={}, overrides=[f"store.node_arena_dir={tmp_path / 'shm'}",
                                          "store.memory_capacity_bytes=1048576"])


def refused(tmp_path: Path, sock: Path, match: str) -> None:
    """Starting the service on ``sock`` is refused with ``match``; the root stays free
    (a service with a clean socket starts on it at once)."""
    cfg = config(tmp_path)
    with pytest.raises(trust.UntrustedPath, match=match):
        NodeService(tmp_path / "root", cfg, sock)
    NodeService(tmp_path / "root", cfg, tmp_path / "clean" / "node.sock").close()


def planted_dir(tmp_path: Path, mode: int, uid: int) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    os.chmod(d, mode)
    os.chown(d, uid, -1)
    return d


def test_a_socket_directory_others_may_write_is_refused(tmp_path: Path) -> None:
    d = planted_dir(tmp_path, 0o777, os.geteuid())
    refused(tmp_path, d / "node.sock", r"socket directory .*/run has mode 777")
    assert not (d / "node.sock").exists()


@as_root
def test_a_socket_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    d = planted_dir(tmp_path, 0o700, OTHER_UID)
    refused(tmp_path, d / "node.sock", r"socket directory .*/run is owned by uid 12345")
    assert not (d / "node.sock").exists()


def test_a_socket_directory_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "run").symlink_to(tmp_path / "elsewhere")
    refused(tmp_path, tmp_path / "run" / "node.sock", r"socket directory .*/run is a symlink")
    assert not (tmp_path / "elsewhere" / "node.sock").exists()


def test_a_socket_path_that_is_a_regular_file_is_refused_never_removed(tmp_path: Path
                                                                        ) -> None:
    (tmp_path / "run").mkdir(mode=0o700)
    victim = tmp_path / "run" / "notes.txt"
    victim.write_text("keep me")
    refused(tmp_path, victim, r"--socket .*notes.txt exists and is not a socket: not removed")
    assert victim.read_text() == "keep me"
    # The command line says so in one line, exit status 2, no traceback.
    out = subprocess.run([sys.executable, "-m", "flatcake.cli", "serve", "--root",
                          str(tmp_path / "root"), "--socket", str(victim), "--set",
                          f"store.node_arena_dir={tmp_path / 'shm'}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stdout.strip().count("\n") == 0 and str(victim) in out.stdout
    assert "not a socket" in out.stdout and "Traceback" not in out.stdout + out.stderr
    assert victim.read_text() == "keep me"


@as_root
def test_a_socket_of_another_user_is_refused_never_removed(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir(mode=0o700)
    sock = tmp_path / "run" / "node.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as planted:
        planted.bind(str(sock))  # not listening: a stale socket, but not ours
    os.chown(sock, OTHER_UID, -1)
    refused(tmp_path, sock, r"--socket .*node.sock is a socket of uid 12345: not removed")
    assert sock.exists()


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.chmod(victim, 0o644)
    return victim


def _arena(tmp_path: Path) -> Path:
    return arena_path((tmp_path / "root").absolute(), config(tmp_path), 0)


def _planted_arena_of_another_user(tmp_path: Path) -> Path:
    path = _arena(tmp_path)
    path.write_bytes(b"planted")
    os.chmod(path, 0o600)
    os.chown(path, OTHER_UID, -1)
    return path


def _planted_open_arena(tmp_path: Path) -> Path:
    path = _arena(tmp_path)
    path.write_bytes(b"planted")
    os.chmod(path, 0o666)
    return path


def _planted_arena_symlink(tmp_path: Path) -> Path:
    path = _arena(tmp_path)
    path.symlink_to(_victim(tmp_path))
    return path


@pytest.mark.parametrize(("plant", "match"), [
    pytest.param(_planted_arena_of_another_user, "is owned by uid 12345",
                 marks=as_root, id="another-user"),
    pytest.param(_planted_open_arena, "has mode 666", id="world-writable"),
    pytest.param(_planted_arena_symlink, "is a symlink", id="symlink"),
])
def test_a_planted_arena_file_is_refused_never_adopted_nor_followed(
        tmp_path: Path, plant: Callable[[Path], Path], match: str) -> None:
    path = plant(tmp_path)
    before = os.lstat(path)
    cfg = config(tmp_path)
    with pytest.raises(trust.UntrustedPath, match=rf"the arena file .*-tp0 {match}"):
        NodeService(tmp_path / "root", cfg, tmp_path / "run" / "node.sock")
    after = os.lstat(path)
    assert (after.st_size, after.st_mode, after.st_uid) == \
        (before.st_size, before.st_mode, before.st_uid)
    if path.is_symlink():  # the victim is neither resized nor re-moded
        victim = os.stat(tmp_path / "victim")
        assert (victim.st_size, victim.st_mode & 0o777) == (8, 0o644)
    assert not (tmp_path / "run" / "node.sock").exists()
    path.unlink()  # the operator removes it: the service starts, the arena is private
    NodeService(tmp_path / "root", cfg, tmp_path / "run" / "node.sock").close()
    st = os.lstat(path)
    assert (st.st_uid, st.st_mode & 0o777, st.st_size) == (os.geteuid(), 0o600, 1048576)


# -- the client ---------------------------------------------------------------------


@contextlib.contextmanager
def listener(sock: Path) -> Iterator[socket.socket]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(sock))
        s.listen(8)
        s.setblocking(False)
        yield s


def never_connected(s: socket.socket) -> bool:
    try:
        s.accept()[0].close()
    except BlockingIOError:
        return True
    return False


@as_root
def test_a_client_refuses_a_socket_of_another_user_before_it_connects(tmp_path: Path
                                                                       ) -> None:
    (tmp_path / "run").mkdir(mode=0o700)
    sock = tmp_path / "run" / "node.sock"
    with listener(sock) as planted:
        os.chown(sock, OTHER_UID, -1)
        client = NodeClient(str(sock), 1.0)
        with pytest.raises(trust.NodeUntrusted, match=r"node.sock is owned by uid 12345"):
            client.call(verbs.STATUS)
        client.close()
        assert never_connected(planted)
        # flatcake serve --status says so in one line, exit status 1.
        out = subprocess.run([sys.executable, "-m", "flatcake.cli", "serve", "--status",
                              "--socket", str(sock)], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 1 and "owned by uid 12345" in out.stdout
        assert "Traceback" not in out.stdout + out.stderr
        assert never_connected(planted)


def test_a_client_refuses_a_socket_in_a_directory_others_may_write(tmp_path: Path) -> None:
    d = planted_dir(tmp_path, 0o777, os.geteuid())
    with listener(d / "node.sock") as planted:
        client = NodeClient(str(d / "node.sock"), 1.0)
        with pytest.raises(trust.NodeUntrusted, match=r"socket directory .*/run has mode 777"):
            client.call(verbs.STATUS)
        client.close()
        assert never_connected(planted)


@as_root
def test_a_client_refuses_a_listener_running_as_another_user(tmp_path: Path) -> None:
    """The socket file is root's, but the process listening on it is uid 12345's
    (``SO_PEERCRED``): refused, and the listener never receives a byte."""
    if not hasattr(socket, "SO_PEERCRED"):
        pytest.skip("no SO_PEERCRED on this platform")
    (tmp_path / "run").mkdir(mode=0o700)
    sock = tmp_path / "run" / "node.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(sock))  # root's file; the child listens on it as another user
    ready_r, ready_w = os.pipe()
    got_r, got_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.setuid(OTHER_UID)
            s.listen(1)
            os.write(ready_w, b"1")
            s.settimeout(20)
            conn, _ = s.accept()
            conn.settimeout(2)
            received = b""
            with contextlib.suppress(OSError):
                while chunk := conn.recv(4096):
                    received += chunk
            os.write(got_w, str(len(received)).encode())
            code = 0
        finally:
            os._exit(code)
    s.close()
    os.close(ready_w)
    os.close(got_w)
    try:
        assert os.read(ready_r, 1) == b"1"
        client = NodeClient(str(sock), 1.0)
        with pytest.raises(trust.NodeUntrusted, match=r"runs as uid 12345"):
            client.call(verbs.STATUS)
        client.close()
        assert os.read(got_r, 16) == b"0"  # connected to ask who it is; nothing sent
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(ready_r)
        os.close(got_r)
