"""Which paths and peers the node service and its clients trust.

The socket, its directory and the shared arena files live where another user may have
planted something before the service started (``/run``, ``/dev/shm``, a shared root).
Each is trusted only when it is not a symlink, is owned by this process's user (or root,
where root is named), and no one else may write it::

    socket directory   missing: made 0700 (``mkdir`` fails if it appears meanwhile);
                       existing: a directory (not a symlink) of ours or root's that no
                       group or other may write (so no one else can swap the socket);
                       with a socket group, 0750 and that group's (members may pass)
    socket (service)   a stale socket of ours is replaced; anything else there (a file,
                       a symlink, another user's socket) is refused and never removed;
                       0600, or 0660 and the socket group's (members may connect)
    socket (client)    a socket (not a symlink) of ours or root's, in a directory as
                       above, whose listener runs as us or root (``SO_PEERCRED``):
                       checked before a byte is sent or received. With a socket group
                       configured, also another user's socket of that group, in a
                       directory of the same user and group, whose listener runs as
                       that user: the service of a group this client was let into
    arena file         made ``O_CREAT | O_EXCL | O_NOFOLLOW``; an existing one is opened
                       ``O_NOFOLLOW`` and kept only when it is a regular file of ours
                       that no group or other may read or write
    a client (service) who it is comes from its connection: the service's number of
                       it and, where the platform says, the peer's pid and uid
                       (``peer_credentials``, read at accept), never from a field
                       it sends

A refusal names the path and what is wrong with it: ``UntrustedPath`` (a ``ValueError``:
the service refuses to start) in the service, ``NodeUntrusted`` (a ``NodeUnavailable``:
the engine serves without FlatCake) in a client.
"""

from __future__ import annotations

import grp
import os
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from flatcake.link.wire import FOREIGN_CLIENT, NodeRefused, NodeUnavailable

ROOT_UID = 0
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
GROUP_DIR_MODE = 0o750  # members pass (never write: they could swap the socket)
GROUP_SOCKET_MODE = 0o660  # members connect (connecting needs write access)


class UntrustedPath(ValueError):
    """A path the service will not use: a symlink, another user's, or writable by
    others (the message names the path and the problem)."""


class NodeUntrusted(NodeUnavailable):
    """A socket the client will not talk to (the message names the path and why)."""


def _owner(uid: int) -> str:
    return "this user" if uid == os.geteuid() else f"uid {uid}"


def _dir_problem(path: Path, st: os.stat_result, owners: set[int] | None = None) -> str:
    """What is wrong with ``path`` (lstat ``st``) as the socket's directory, or ''
    (``owners``: the uids it may belong to; this user and root by default)."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid not in (owners or {os.geteuid(), ROOT_UID}):
        return f"is owned by {_owner(st.st_uid)}, not by this user or root"
    if st.st_mode & 0o022:
        return (f"has mode {stat.S_IMODE(st.st_mode):o}: others may write it (and "
                "replace the socket); give the socket a directory of its own")
    return ""


def socket_group(name: str) -> int | None:
    """The gid of ``store.node_socket_group`` ``name`` (a group name or a numeric gid;
    '' = none); ``ValueError`` naming a group that does not exist."""
    if not name:
        return None
    if name.isdigit():
        return int(name)
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise ValueError(f"store.node_socket_group={name!r}: no such group") from None


def socket_dir(path: Path, gid: int | None = None) -> None:
    """Make the socket's directory ``path`` (0700, its missing parents too; with a
    socket group ``gid``, 0750 and that group's), or check the one there (see the
    module); raises ``UntrustedPath``."""
    path.parent.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    try:
        os.mkdir(path, PRIVATE_DIR_MODE)
        # ours: made just now (never an existing one, nor through a symlink)
    except FileExistsError:
        st = os.lstat(path)
        problem = _dir_problem(path, st)
        if problem:
            raise UntrustedPath(f"socket directory {path} {problem}") from None
        if st.st_uid != os.geteuid():
            return  # root's: used as it is (members pass where root lets them)
    if gid is not None:
        _give_group(path, gid, GROUP_DIR_MODE)


def _give_group(path: Path, gid: int, mode: int) -> None:
    """``path`` (ours, not a symlink) to group ``gid`` with ``mode``."""
    try:
        os.chown(path, -1, gid, follow_symlinks=False)
    except OSError as exc:
        raise UntrustedPath(f"{path}: cannot give it to store.node_socket_group (gid "
                            f"{gid}): {exc.strerror} (the service's user must be a "
                            "member of the group)") from None
    os.chmod(path, mode)


def socket_access(path: Path, gid: int | None) -> None:
    """The service's socket ``path``: 0600, or 0660 and group ``gid``'s."""
    if gid is None:
        os.chmod(path, PRIVATE_FILE_MODE)
    else:
        _give_group(path, gid, GROUP_SOCKET_MODE)


def stale_socket(path: Path) -> bool:
    """Whether a socket of ours is at ``path`` (the service may replace it once no one
    listens there); raises ``UntrustedPath`` for anything else there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        problem = "is a symlink"
    elif not stat.S_ISSOCK(st.st_mode):
        problem = "exists and is not a socket"
    elif st.st_uid != os.geteuid():
        problem = f"is a socket of {_owner(st.st_uid)}"
    else:
        return True
    raise UntrustedPath(f"--socket {path} {problem}: not removed; remove it yourself or "
                        "give the service another --socket")


def open_private(path: Path, what: str) -> int:
    """A read-write descriptor of the private file ``path`` (``what`` names it): made
    (mode 0600) when missing, else opened without following a symlink and kept only when
    it is a regular file of ours that no group or other may read or write; raises
    ``UntrustedPath``."""
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    except FileExistsError:
        pass
    else:
        os.fchmod(fd, PRIVATE_FILE_MODE)  # exact mode whatever the umask
        return fd
    try:
        fd = os.open(path, flags | os.O_NONBLOCK)  # a planted FIFO must not block us
    except OSError as exc:
        problem = "is a symlink" if os.path.islink(path) else f"cannot be opened ({exc})"
        raise UntrustedPath(f"{what} {path} {problem}: not used; remove it") from None
    st = os.fstat(fd)
    problem = ""
    if not stat.S_ISREG(st.st_mode):
        problem = "is not a regular file"
    elif st.st_uid != os.geteuid():
        problem = f"is owned by {_owner(st.st_uid)}"
    elif st.st_mode & 0o077:
        problem = (f"has mode {stat.S_IMODE(st.st_mode):o}: others may have read or "
                   "mapped it")
    if problem:
        os.close(fd)
        raise UntrustedPath(f"{what} {path} {problem}: not used; remove it")
    os.set_blocking(fd, True)
    return fd


def check_service(path: Path, timeout_s: float, gid: int | None = None) -> None:
    """Refuse (``NodeUntrusted``) a service socket at ``path`` another user could have
    planted or could listen on (see the module; ``gid``: the configured socket group);
    ``NodeUnavailable`` when no one listens there."""
    try:
        dir_st = os.lstat(path.parent)
        st = os.lstat(path)
    except FileNotFoundError:
        raise NodeUnavailable(f"no node service socket at {path}") from None
    except PermissionError:
        raise NodeUntrusted(f"the node service's socket {path} cannot be reached by this "
                            "user (not a member of its socket group?)") from None
    trusted = {os.geteuid(), ROOT_UID}
    # The socket group's service: its socket and directory of one user and that group.
    if gid is not None and st.st_gid == gid == dir_st.st_gid and st.st_uid == dir_st.st_uid:
        trusted.add(st.st_uid)
    who = "this user, root" + (f" or a service of group {gid}" if gid is not None else "")
    problem = _dir_problem(path.parent, dir_st, trusted)
    if problem:
        raise NodeUntrusted(f"the node service's socket directory {path.parent} {problem}")
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISSOCK(st.st_mode):
        raise NodeUntrusted(f"{path} is not a socket (a symlink or another file)")
    if st.st_uid not in trusted:
        raise NodeUntrusted(f"the socket {path} is owned by {_owner(st.st_uid)}, not by "
                            f"{who}: not used")
    uid = _listener_uid(path, timeout_s)
    if uid is not None and uid not in (os.geteuid(), ROOT_UID, st.st_uid):
        raise NodeUntrusted(f"the process listening on {path} runs as {_owner(uid)}, not "
                            f"as {who}: not used")


def peer_credentials(sock: socket.socket) -> tuple[int, int] | None:
    """The (pid, uid) of the process at the other end of the connected unix socket
    ``sock`` (``SO_PEERCRED``; None where the platform does not say)."""
    peercred = getattr(socket, "SO_PEERCRED", None)
    if peercred is None:
        return None
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, peercred, struct.calcsize("3i"))
    except OSError:
        return None
    pid, uid, _gid = struct.unpack("3i", creds)
    return int(pid), int(uid)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who made a call: its connection (numbered by the service from 1, never reused
    while it serves) and the (pid, uid) of its peer process, read at accept."""

    connection: int
    credentials: tuple[int, int] | None = None

    def owner(self) -> Owner:
        """This caller as the owner of what it attaches now."""
        return Owner(self.connection, self.credentials)


@dataclass(frozen=True, slots=True)
class Owner:
    """The caller that attached an engine or a store: only it may call as that one."""

    connection: int
    credentials: tuple[int, int] | None  # (pid, uid), where the platform says

    def admits(self, caller: Caller) -> bool:
        """Whether ``caller`` is this owner: its connection, or another connection of
        the same process (a socket renewed after a timeout, a waiting thread's own)."""
        if caller.connection == self.connection:
            return True
        return self.credentials is not None and caller.credentials == self.credentials

    def refuse(self, what: str) -> NodeRefused:
        """The answer to a caller this owner does not admit (``what``: whom it named)."""
        pid = f" (pid {self.credentials[0]})" if self.credentials else ""
        return NodeRefused(f"{what} {FOREIGN_CLIENT}: it was attached over another "
                           f"connection{pid}; a connection calls only as what it "
                           "attached itself")


# Owns what was made in this process, not attached (no connection is numbered 0).
NOBODY = Owner(0, None)


def _listener_uid(path: Path, timeout_s: float) -> int | None:
    """The uid of the process listening on ``path`` (``SO_PEERCRED``; None where the
    platform does not say)."""
    peercred = getattr(socket, "SO_PEERCRED", None)
    if peercred is None:
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout_s)
        try:
            probe.connect(str(path))
        except OSError as exc:
            raise NodeUnavailable(f"no node service listens on {path} ({exc})") from None
        creds = probe.getsockopt(socket.SOL_SOCKET, peercred, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)
