"""``store.node_socket_group``: the members of a named group attach to the node service
(its socket 0660 and its directory 0750, both that group's) and are answered; another
user outside the group cannot reach the socket; a client trusts another user's service
socket only when it is of the configured group.

The tests run as root here: "another user" is uid 12345, a member of gid 23456 (neither
needs an entry in /etc/passwd or /etc/group), a forked child that drops to them."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from flatcake.link import trust, verbs
from flatcake.link.client import NodeClient
from tests.service.helpers import Service
from tests.store.helpers import SMALL

MEMBER_UID, OTHER_UID, GID = 12345, 12346, 23456
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="another user's process needs root")


def member_calls(sock: Path, group: str) -> dict[str, object]:
    """Attach a store to ``sock`` (trusting socket group ``group``), look up a miss, ask
    the status: what it got."""
    client = NodeClient(str(sock), 5.0, group)
    try:
        got = client.call(verbs.ATTACH_STORE, "", "member", os.getpid(), SMALL)
        hit = client.call(verbs.CONTROL["lookup"], got.engine_id, (b"k" * 32,))
        st = client.call(verbs.STATUS)
        return {"id": got.engine_id, "hit": hit.num_blocks, "stores": list(st["stores"])}
    finally:
        client.close()


@pytest.fixture
def run_dir() -> Iterator[Path]:
    """A directory every user may pass (tmp_path's parents are root's, 0700)."""
    d = Path(tempfile.mkdtemp(prefix="flatcake-group-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


def as_user(uid: int, gid: int | None, sock: Path, group: str) -> dict[str, object]:
    """``member_calls`` in a child running as ``uid`` (in group ``gid`` when given; it
    forks: another user cannot read this interpreter's files), or the error it met."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.setgroups([gid] if gid is not None else [])
            os.setgid(gid if gid is not None else 65534)
            os.setuid(uid)
            try:
                out: dict[str, object] = member_calls(sock, group)
            except Exception as exc:
                out = {"error": f"{type(exc).__name__}: {exc}"}
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as got:
        data = got.read()
    os.waitpid(pid, 0)
    done: dict[str, object] = json.loads(data)
    return done


@as_root
def test_a_member_of_the_socket_group_attaches_and_others_cannot(
        tmp_path: Path, run_dir: Path) -> None:
    sock = run_dir / "run" / "node.sock"
    svc = Service(tmp_path / "root", sock, f"store.node_socket_group={GID}").start()
    try:
        st, dir_st = os.lstat(sock), os.lstat(sock.parent)
        assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o660, GID)
        assert (stat.S_IMODE(dir_st.st_mode), dir_st.st_gid) == (0o750, GID)
        member = as_user(MEMBER_UID, GID, sock, str(GID))
        assert member.get("hit") == 0 and member["stores"] == [member["id"]], member
        # Outside the group: the socket cannot be reached (nothing sent).
        other = as_user(OTHER_UID, None, sock, str(GID))
        assert "cannot be reached by this user" in str(other.get("error")), other
        assert svc.proc is not None and svc.proc.poll() is None, svc.stderr()
    finally:
        assert svc.stop() == 0, svc.stderr()


@as_root
def test_another_users_socket_is_trusted_only_when_of_the_configured_group(
        run_dir: Path) -> None:
    d = run_dir / "run"
    d.mkdir(mode=0o750)
    os.chown(d, MEMBER_UID, GID)
    sock = d / "node.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(sock))
        s.listen(4)
        os.chown(sock, MEMBER_UID, GID)
        trust.check_service(sock, 1.0, GID)  # the configured group's service
        for gid in (None, GID + 1):  # no group, or another one
            with pytest.raises(trust.NodeUntrusted, match="owned by uid 12345"):
                trust.check_service(sock, 1.0, gid)
        # A group's socket in a directory of another group is not its service's.
        os.chown(d, MEMBER_UID, GID + 1)
        with pytest.raises(trust.NodeUntrusted, match="owned by uid 12345"):
            trust.check_service(sock, 1.0, GID)


def test_a_socket_group_that_does_not_exist_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"store\.node_socket_group='no-such-group-x'"):
        trust.socket_group("no-such-group-x")
    assert trust.socket_group("") is None and trust.socket_group("42") == 42
