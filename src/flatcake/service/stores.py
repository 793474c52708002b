"""``FlatCakeStore``s attached to the node service (``link.control.RemoteControl``):
their ``ControlPlane`` calls, run on the node's books on each store's own FC-MAS queue,
and what each holds there (its loads and stores in flight), released when its lease ends
or it detaches. Each call is scoped to the store: to its tenant's sessions and segments
(``service.tenants``: the session ids it names are its tenant's own, translated to the
books' names and back; another tenant's are left out of listings and refused by name)
and to its own loads and stores in flight (another store's are not its to complete).
A ``servable`` asked to wait for a store in flight is held (``ServableWait``) and
answered by the service's loop once the store is durable.

Fencing: a store whose lease ends may only be paused (a GC pause, a SIGSTOPped
container, a slow disk) and write its ranges when it resumes. Its unfinished writes are
therefore fenced, not given back (``service.fences``: never published, their ranges held,
never handed to another store) until its process is gone (its pid, from the
connection's peer credentials, no longer names the process that attached) or the
service restarts.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flatcake.control import ControlPlane, StorePlan
from flatcake.control.types import ReclaimAction
from flatcake.link import verbs, wire
from flatcake.link.trust import NOBODY, Owner
from flatcake.plan.requests import (
    FileWork,
    Servable,
    StoreEnded,
    begin_store,
    end_store,
    reclaim_tasks,
    servable,
)
from flatcake.plan.stream import StreamPlanner
from flatcake.service.fences import Fenced, fence
from flatcake.service.tenants import SessionTenants, inside, outside

logger = logging.getLogger("flatcake.service")


@dataclass(slots=True)
class AttachedStore:
    """An attached ``FlatCakeStore``: what it holds in the books, for its lease."""

    client_id: str
    name: str
    pid: int
    last_call: float
    started: int | None = None  # its process's start time (``process_start``)
    loads: set[Any] = dataclasses.field(default_factory=set)
    stores: dict[int, StorePlan] = dataclasses.field(default_factory=dict)
    owner: Owner = NOBODY  # the caller that attached it: only it calls as this store
    tenant: bytes = b""  # its key salt's tag (``control.keys.tenant_tag``)
    # What each call in flight prepared (call id -> ("store", segment id) or ("load",
    # request id)), until it completes: undone if its client gives up on the call.
    made_by: dict[int, tuple[str, Any]] = dataclasses.field(default_factory=dict)
    # Calls given up on before they were read: never run (the newest MAX_GAVE_UP).
    abandoned: dict[int, None] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ServableWait:
    """A store's ``servable`` held until no store in flight writes the blocks right
    after its hit, its store is released, or ``deadline`` (monotonic seconds)."""

    client_id: str
    keys: tuple[bytes, ...]
    engine_blocks: int
    deadline: float

    def answer(self, control: ControlPlane, now: float, attached: bool) -> Servable | None:
        """The answer now, or None while it still waits."""
        found = servable(control, self.keys, self.engine_blocks)
        return None if found.wait and attached and now < self.deadline else found


# Verbs naming a session (its id their first argument), checked against the tenant.
_SESSION_VERBS = frozenset({"session", "newest_turn_index", "files_of", "drop_session",
                            "cut_pending"})
# Verbs naming a segment (its id their first argument).
_SEGMENT_VERBS = frozenset({"segment", "mark_damaged"})


def _scope(store: AttachedStore, control: ControlPlane, tenants: SessionTenants,
           method: str, args: dict[str, Any]) -> bool:
    """Refuse (``NodeRefused``) a call naming what is not ``store``'s tenant's; False
    for a completion of what is not ``store``'s own (not run: another store's load or
    store in flight, or one its lease already ended)."""
    tenant = store.tenant
    if "session_id" in args:  # the caller's name of it, the books' from here on
        args["session_id"] = inside(tenant, args["session_id"], method)
    if method in _SESSION_VERBS:
        tenants.check(control, tenant, args["session_id"], method)
    elif method in _SEGMENT_VERBS:
        try:
            sid = control.segment(args["segment_id"]).session_id
        except KeyError:
            return True  # no such segment: the books answer as for anyone
        tenants.check(control, tenant, sid, method)
    elif method in ("prepare_store", "begin_store"):
        tenants.check_write(control, tenant, args["session_id"], args["keys"])
    elif method == "prepare_load":
        tenants.check_hit(control, tenant, args["keys_or_hit"], method)
    elif method == "complete_load":
        return args["request_id"] in store.loads
    elif method in ("complete_store", "end_store"):
        plan = args["plan"]
        return store.stores.get(plan.segment.segment_id) == plan
    elif method == "submit_restore":
        return args["plan"].request_id in store.loads
    return True


def abandon_calls(store: AttachedStore, control: ControlPlane,
                  call_ids: tuple[int, ...]) -> None:
    """``store``'s client stopped waiting for ``call_ids`` (it never saw their answers):
    a store they prepared is rolled back (never published), a load they pinned
    unpinned; one not read yet will not run."""
    for call_id in call_ids:
        made = store.made_by.pop(call_id, None)
        if made is None:
            store.abandoned[call_id] = None
            while len(store.abandoned) > wire.MAX_GAVE_UP:
                del store.abandoned[next(iter(store.abandoned))]
            continue
        kind, key = made
        if kind == "store" and key in store.stores:
            control.complete_store(store.stores.pop(key), False)
        elif kind == "load" and key in store.loads:
            store.loads.discard(key)
            control.complete_load(key)
        logger.info("store %s gave up call %d: its %s %r undone", store.client_id,
                    call_id, kind, key)


def _prepared(store: AttachedStore, control: ControlPlane, tenants: SessionTenants,
              call_id: int, plan: StorePlan) -> None:
    """Call ``call_id`` of ``store`` prepared ``plan``: its store in flight (undone if
    the call is given up), its session its tenant's."""
    store.stores[plan.segment.segment_id] = plan
    store.made_by[call_id] = ("store", plan.segment.segment_id)
    tenants.claim(control, store.tenant, plan.session_id)


def _made(store: AttachedStore, kind: str, key: Any) -> None:
    """What a call prepared is complete: no longer undone if its call is given up."""
    for call_id in [c for c, m in store.made_by.items() if m == (kind, key)]:
        del store.made_by[call_id]


def _reclaimed(store: AttachedStore, tenants: SessionTenants, files: FileWork,
               actions: Sequence[ReclaimAction]) -> list[ReclaimAction]:
    """The books dropped ``actions`` in a call of ``store``: the service deletes and
    cuts their files itself (``files``); the store is told of its tenant's sessions
    only, by its names (another tenant's dropped sessions are not its to know nor to
    act on)."""
    cuts, drops = reclaim_tasks(actions)
    if cuts or drops:
        files(drops, cuts, ())
    mine = tenants.names(store.tenant, {a.session_id for a in actions})
    return [dataclasses.replace(a, session_id=mine[a.session_id]) for a in actions
            if a.session_id in mine]


def _end_store(store: AttachedStore, control: ControlPlane, files: FileWork,
               plan: StorePlan, ok: bool, copied: bool) -> StoreEnded:
    """``plan.requests.end_store`` of ``store``'s own store in flight (``_scope``): its
    memory copy told when ``copied``, published only when ``ok``. The window rows the
    books released are punched by the service (``files``), so the store is handed none,
    as for ``take_window_releases``."""
    ended = end_store(control, plan, ok, copied)
    store.stores.pop(plan.segment.segment_id, None)
    _made(store, "store", plan.segment.segment_id)
    if ended.releases:
        files((), (), ended.releases)
    return dataclasses.replace(ended, releases=())


def attached_call(store: AttachedStore, control: ControlPlane, tenants: SessionTenants,
                  call_id: int, method: str, args: dict[str, Any], *,
                  files: FileWork) -> Any:
    """Call ``call_id`` of an attached store: one ``ControlPlane`` call (``args`` by
    parameter name, decoded as ``link.verbs.CONTROL[method]`` declares), on its own
    FC-MAS queue, scoped to its tenant and to what it holds (module docstring); its
    loads and stores in flight are kept for its lease, and by call until they complete
    (``abandon_calls``). ``servable`` with ``wait_s`` may answer a ``ServableWait`` for
    the service to hold. The files of what the books drop, and the window rows they
    release, are the service's (``files``: ``_reclaimed``, and an attached store's
    ``take_window_releases`` is answered with none, whoever's rows they were)."""
    if method not in verbs.CONTROL:
        raise wire.NodeRefused(f"unknown control call {method!r}")
    if call_id in store.abandoned:  # given up on before it was read
        del store.abandoned[call_id]
        raise wire.NodeRefused(f"{method} not run: {wire.GAVE_UP}")
    if not _scope(store, control, tenants, method, args):
        return None
    if method == verbs.SERVABLE.name:
        keys, engine_blocks, wait_s = args["keys"], args["engine_blocks"], args["wait_s"]
        found = servable(control, keys, engine_blocks)
        tenants.claim_hit(control, store.tenant, found.hit)
        if not (math.isfinite(wait_s) and wait_s >= 0):  # its deadline times the loop
            raise wire.NodeRefused(f"servable: wait_s must be finite and >= 0, got {wait_s}")
        if found.wait and wait_s > 0:
            return ServableWait(store.client_id, keys, engine_blocks,
                                store.last_call + wait_s)
        return found
    if method in verbs.FCMAS:
        args = {**args, "queue": store.client_id}
    if method == "prepare_load":
        # The planner is the service's own (a stream planner, when asked for one):
        # what it recorded goes back as data.
        planner = StreamPlanner({}) if args.pop("stream") else None
        plan = control.prepare_load(**args, planner=planner)
        store.loads.add(args["request_id"])
        store.made_by[call_id] = ("load", args["request_id"])
        return verbs.LoadPlanned(plan, planner.stream_request if planner else [],
                                 planner.checks if planner else [])
    if method == "end_store":
        return _end_store(store, control, files, **args)
    if method == "begin_store":
        begun = begin_store(control, **args)
        if begun.plan is not None:
            _prepared(store, control, tenants, call_id, begun.plan)
        return dataclasses.replace(
            begun, settled=tuple(_reclaimed(store, tenants, files, begun.settled)),
            reclaimed=tuple(_reclaimed(store, tenants, files, begun.reclaimed)))
    out = getattr(control, method)(**args)
    if method == "lookup":
        tenants.claim_hit(control, store.tenant, out)
    elif method == "session_ids":
        return list(tenants.names(store.tenant, out).values())
    elif method == "session":  # its own (``_scope``), a copy by its name
        name = outside(store.tenant, out.session_id)
        assert name is not None  # its own: named in its namespace
        return dataclasses.replace(out, session_id=name)
    elif method == "segments":
        segs = list(out)
        mine = tenants.names(store.tenant, {s.session_id for s in segs})
        return [s for s in segs if s.session_id in mine]
    elif method == "ready_cuts":
        mine = tenants.names(store.tenant, {sid for sid, _ in out})
        return [(mine[sid], seg) for sid, seg in out if sid in mine]
    elif method == "complete_load":
        store.loads.discard(args["request_id"])
        _made(store, "load", args["request_id"])
    elif method == "prepare_store" and out is not None:
        _prepared(store, control, tenants, call_id, out)
    elif method == "complete_store":
        store.stores.pop(args["plan"].segment.segment_id, None)
        _made(store, "store", args["plan"].segment.segment_id)
    elif method == "take_window_releases":  # the service punches them, not the store
        files((), (), out)
        return []
    elif method in ("take_reclaim_actions", "settle_damage", "reclaim"):
        return _reclaimed(store, tenants, files, out)
    elif method == "drop_session":  # its own session (``_scope``)
        return _reclaimed(store, tenants, files, [out])[0]
    return out


def release_store(store: AttachedStore, control: ControlPlane | None, why: str, *,
                  lease_ended: bool = False) -> Fenced | None:
    """Its lease ended (or it detached): its restores unpinned, its FC-MAS queue gone,
    its unfinished writes rolled back (never published). A store whose lease ended and
    whose process may still be there has its unfinished writes fenced
    (``service.fences``): returned, for ``free_fenced`` once its process is gone."""
    busy = bool(store.loads or store.stores)
    fenced = None
    if control is not None:
        for request_id in store.loads:
            control.complete_load(request_id)
        if lease_ended:
            fenced = fence(control, f"store {store.client_id}", store.pid, store.started,
                           list(store.stores.values()))
        else:
            for plan in store.stores.values():
                control.complete_store(plan, False)
        control.drop_restore_queue(store.client_id)
    (logger.warning if busy else logger.info)(
        "store %s (%s, pid %d) %s%s", store.client_id, store.name, store.pid, why,
        "" if not busy else ": its restores unpinned, its unfinished writes rolled back"
        if fenced is None else ": its restores unpinned, its unfinished writes fenced "
        f"(never published, the ranges of {len(fenced.plans)} held until its process is "
        "gone)")
    return fenced
