"""Each tenant's own session names over the node's books, and which tenant each session
belongs to, so that no session verb of one tenant's attached store or engine lists,
reads, loads, drops or writes another's, and two tenants naming the same session are
both served, each its own.

Names: a tenant names its sessions in its own namespace. The service translates, in
this module only, every session id a client sends into the books' name and back in its
answers (``inside``, ``outside``); the books stay tenant-blind::

    the client names     the books hold (and the session file's header)
    "chat", no salt      "chat"
    "chat", tenant T     U+001F, T in 32 hex digits, U+001F, "chat"

so two tenants' "chat" are two sessions, and a restart recovers each one's tenant from
its name. Segments and store plans carry the books' name (the attached store writes it
into the session file's header); every verb also takes a tenant's own books' name, and
refuses another namespace's (an id that starts with U+001F and not the caller's prefix).

A tenant is its key salt (``control.keys.tenant_tag``: a digest of ``tenant_salt``,
empty for none), named by a store or an engine when it attaches. Block keys are salted,
so nobody can name another tenant's blocks by key. A session with a tenant's prefix is
that tenant's; the plain names (the tenant without a salt, sessions written before the
names had prefixes, an embedded store's) are the ones whose tenant the service records
when it sees them written::

    a session is        who may name it
    not in the books    anyone (a store writing it first makes it its tenant's)
    recorded for T      tenant T only; listings of others leave it out
    unrecorded          (in the books, its record lost: a crash right after its first
                        write, a root older than the record) no one, until a lookup
                        of T hits its blocks or a write of T continues it (knowing
                        its keys proves the tenant)

The record survives restarts: ``ROOT/tenants``, one JSON line ``[tag hex, session id]``
for each session when it is first recorded, appended with the loop's next tick (at most
a second later, every line of the tick in one write) and at close (not synced: a record
lost in a crash leaves its session unrecorded, never another tenant's), rewritten with
the live sessions only once it holds many more lines than them. The books stay
tenant-blind; only the service's verbs consult this. Owned by the service's loop thread (no lock).

An attached engine's scheduler half is held to the same rules (``TenantScope``): the
sessions its requests name and those it starts are its tenant's (``name``, ``prefix``;
named back by ``own``), a hit holding another tenant's session is looked up as a miss,
a turn into another tenant's plain session is not stored, and its block events leave
out other tenants' blocks.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from flatcake.control import ControlPlane
from flatcake.control.index import PrefixHit
from flatcake.control.sessions import check_session_id
from flatcake.link import trust, wire

logger = logging.getLogger("flatcake.service")

RECORD_NAME = "tenants"
_COMPACT_LINES = 4096  # rewritten past this many lines more than twice the live ones
MARK = "\x1f"  # opens and closes a tenant's prefix in the books' names


def prefix(tenant: bytes) -> str:
    """The books' prefix of ``tenant``'s session names ("" for the tenant without a
    salt)."""
    return f"{MARK}{tenant.hex()}{MARK}" if tenant else ""


def inside(tenant: bytes, session_id: object, verb: str) -> str:
    """The books' name of ``tenant``'s session ``session_id`` (its own books' name is
    kept); ``NodeRefused`` for an id that is not one (not a non-empty str, too long with
    the prefix, or another tenant's namespace)."""
    try:
        check_session_id(session_id)
    except ValueError as exc:
        raise wire.NodeRefused(f"{verb}: {exc}") from None
    assert isinstance(session_id, str)
    own = prefix(tenant)
    if session_id.startswith(MARK):
        if own and session_id.startswith(own):
            return session_id
        raise wire.NodeRefused(f"{verb}: session {session_id[:80]!r} is in another "
                               "tenant's namespace (an id that starts with U+001F is a "
                               "tenant's name in the books): refused")
    try:
        return check_session_id(own + session_id)
    except ValueError as exc:
        raise wire.NodeRefused(f"{verb}: {exc} ({len(own)} bytes of it the tenant's "
                               "prefix)") from None


def outside(tenant: bytes, name: str) -> str | None:
    """``tenant``'s name of the books' session ``name``; None where ``name`` is not in
    its namespace."""
    own = prefix(tenant)
    if own:
        return name[len(own):] if name.startswith(own) else None
    return None if name.startswith(MARK) else name


class SessionTenants:
    """The tenant of each session written through the service (see the module)."""

    def __init__(self, root: Path | None = None) -> None:
        """``root``: where the record lives (None: in memory only)."""
        self._of: dict[str, bytes] = {}
        self._path = None if root is None else Path(root) / RECORD_NAME
        self._lines = 0
        self._fd = -1  # the record, open for appends from its load on
        self._unwritten: list[str] = []  # its lines recorded since the last ``flush``
        if self._path is not None:
            self._load(self._path)

    def _load(self, path: Path) -> None:
        os.close(trust.open_private(path, "tenant record"))  # ours, 0600, no symlink
        for n, line in enumerate(path.read_text().splitlines()):
            try:
                tag, sid = json.loads(line)
                self._of[str(sid)] = bytes.fromhex(tag)
            except (ValueError, TypeError):
                logger.warning("%s line %d is not [tag, session]: skipped (a torn "
                               "append)", path, n + 1)
        self._lines = len(self._of)
        self._rewrite()

    def _rewrite(self) -> None:
        """The record rewritten with the live sessions only (atomically)."""
        if self._path is None:
            return
        tmp = self._path.with_name(RECORD_NAME + ".tmp")
        tmp.unlink(missing_ok=True)
        fd = trust.open_private(tmp, "tenant record")
        try:
            os.write(fd, "".join(json.dumps([tag.hex(), sid]) + "\n"
                                 for sid, tag in self._of.items()).encode())
            os.fsync(fd)
            tmp.replace(self._path)
        except BaseException:
            os.close(fd)
            raise
        self._unwritten.clear()  # the new record holds them
        self.close()
        self._fd = fd  # the new record, kept open for appends (one write a session)
        self._lines = len(self._of)

    def flush(self) -> None:
        """Append the lines recorded since the last flush to the record (one write)."""
        if self._unwritten and self._fd >= 0:
            os.write(self._fd, "".join(self._unwritten).encode())
        self._unwritten.clear()

    def close(self) -> None:
        self.flush()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _record(self, session_id: str, tenant: bytes) -> None:
        if session_id.startswith(MARK) or self._of.get(session_id) == tenant:
            return  # a prefixed name is its prefix's tenant's
        self._of[session_id] = tenant
        if self._path is None:
            return
        self._unwritten.append(json.dumps([tenant.hex(), session_id]) + "\n")
        self._lines += 1

    @staticmethod
    def _held(control: ControlPlane, session_id: str) -> bool:
        try:
            control.session(session_id)
        except KeyError:
            return False
        return True

    def owns(self, control: ControlPlane, tenant: bytes, session_id: str) -> bool:
        """Whether ``tenant`` may name ``session_id`` (yes when the books do not hold
        it: there is nothing of anyone's to see)."""
        if session_id.startswith(MARK):
            own = prefix(tenant)
            return bool(own) and session_id.startswith(own)
        got = self._of.get(session_id)
        if got == tenant:
            return True
        if not self._held(control, session_id):
            self._of.pop(session_id, None)  # gone: its name is free again
            return True
        return False

    def check(self, control: ControlPlane, tenant: bytes, session_id: str, verb: str
              ) -> None:
        """Refuse (``NodeRefused``) ``verb`` of ``tenant`` on a session it does not own."""
        if not isinstance(session_id, str):
            raise wire.NodeRefused(f"{verb}: a session id is a str, got "
                                   f"{type(session_id).__name__}")
        if self.owns(control, tenant, session_id):
            return
        whose = ("has no tenant on record (its record was lost): the first tenant "
                 "whose lookup finds its blocks claims it"
                 if session_id not in self._of and not session_id.startswith(MARK)
                 else "is another tenant's")
        raise wire.NodeRefused(f"{verb}: session {session_id!r} {whose}: refused")

    def check_write(self, control: ControlPlane, tenant: bytes, session_id: str,
                    keys: tuple[bytes, ...]) -> None:
        """Refuse ``tenant``'s write of ``keys`` into a session it does not own; an
        unrecorded one it continues (its keys hit the session's blocks) becomes its."""
        if isinstance(session_id, str) and session_id not in self._of \
                and not session_id.startswith(MARK) and self._held(control, session_id) \
                and any(run.segment.session_id == session_id
                        for run in control.lookup(keys).runs):
            self._record(session_id, tenant)
        self.check(control, tenant, session_id, "prepare_store")

    def claim(self, control: ControlPlane, tenant: bytes, session_id: str) -> None:
        """``tenant`` wrote ``session_id`` (a store after ``check_write``, or an
        engine): its tenant's from now on, unless another tenant's already."""
        if self.owns(control, tenant, session_id) or session_id not in self._of:
            self._record(session_id, tenant)

    def claim_hit(self, control: ControlPlane, tenant: bytes, hit: PrefixHit) -> None:
        """``tenant``'s keys hit these blocks (only it can name them): the unrecorded
        sessions holding them are its."""
        for run in hit.runs:
            sid = run.segment.session_id
            if sid not in self._of:
                self._record(sid, tenant)

    def check_hit(self, control: ControlPlane, tenant: bytes, hit: PrefixHit, verb: str
                  ) -> None:
        """Refuse a hit (a load's) holding any block of a session ``tenant`` does not
        own."""
        if not isinstance(hit, PrefixHit):
            raise wire.NodeRefused(f"{verb}: a hit is a PrefixHit, got "
                                   f"{type(hit).__name__}")
        for sid in {run.segment.session_id for run in hit.runs}:
            self.check(control, tenant, sid, verb)

    def names(self, tenant: bytes, session_ids: Iterable[str]) -> dict[str, str]:
        """The books' sessions ``session_ids`` that ``tenant`` names: each one's name
        for it, by its books' name (a plain session recorded for a tenant with a
        prefix, written before names had one, is left out: it cannot name it)."""
        out = {}
        for sid in session_ids:
            if sid.startswith(MARK) or self._of.get(sid) == tenant:
                name = outside(tenant, sid)
                if name is not None:
                    out[sid] = name
        return out

    def sweep(self, control: ControlPlane) -> None:
        """Forget the sessions the books no longer hold (reclaimed, dropped); rewrite
        the record once it holds many more lines than live sessions."""
        held = set(control.session_ids())
        for sid in [s for s in self._of if s not in held]:
            del self._of[sid]
        if self._lines > 2 * len(self._of) + _COMPACT_LINES:
            self._rewrite()
        self.flush()


@dataclass(frozen=True, slots=True)
class TenantScope:
    """One attached engine's tenant over the node's books
    (``connectors.scheduler_side.SessionScope``): an attached store's rules."""

    tenants: SessionTenants
    control: ControlPlane
    tenant: bytes

    def check_hit(self, hit: PrefixHit) -> None:
        """Refuse a hit holding another tenant's session (an unrecorded one it hits is
        its, as for a store's lookup)."""
        self.tenants.claim_hit(self.control, self.tenant, hit)
        self.tenants.check_hit(self.control, self.tenant, hit, "lookup")

    def check_write(self, session_id: str, keys: tuple[bytes, ...]) -> None:
        """Refuse a write of ``keys`` into another tenant's session."""
        self.tenants.check_write(self.control, self.tenant, session_id, keys)

    def sees(self, session_id: str) -> bool:
        """Whether ``session_id`` is on record as this tenant's."""
        return session_id in self.tenants.names(self.tenant, (session_id,))

    def name(self, explicit: object) -> object:
        """The books' name of the session a request names (``inside``); None (no
        name) and what is not a str (refused by the session tracker) as they are."""
        if not isinstance(explicit, str):
            return explicit
        return inside(self.tenant, explicit, "kv_transfer_params.session_id")

    @property
    def prefix(self) -> str:
        """The prefix of the sessions this engine starts without a name."""
        return prefix(self.tenant)

    def own(self, session_id: str) -> str:
        """This tenant's name of the books' session ``session_id`` (a plain one it
        cannot name, written before names had prefixes, as it is)."""
        name = outside(self.tenant, session_id)
        return session_id if name is None else name
