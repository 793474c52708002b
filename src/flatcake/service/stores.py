"""``FlatCakeStore``s attached to the node service (``link.control.RemoteControl``):
their ``ControlPlane`` calls, run on the node's books on each store's own FC-MAS queue,
and what each holds there (its loads and stores in flight), released when its lease ends
or it detaches. A ``servable`` asked to wait for a store in flight is held
(``ServableWait``) and answered by the service's loop once the store is durable.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any

from flatcake.control import ControlPlane, StorePlan
from flatcake.control.types import WindowRelease
from flatcake.link import wire
from flatcake.link.trust import NOBODY, Owner
from flatcake.plan.requests import Servable, servable

logger = logging.getLogger("flatcake.service")


@dataclass(slots=True)
class AttachedStore:
    """An attached ``FlatCakeStore``: what it holds in the books, for its lease."""

    client_id: str
    name: str
    pid: int
    last_call: float
    loads: set[Any] = dataclasses.field(default_factory=set)
    stores: dict[int, StorePlan] = dataclasses.field(default_factory=dict)
    # The window releases of its last take, until its next call: it punches them
    # before it calls again (``FlatCakeStore._release_windows``).
    handed: tuple[WindowRelease, ...] = ()
    owner: Owner = NOBODY  # the caller that attached it: only it calls as this store


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


def attached_call(store: AttachedStore, control: ControlPlane, method: str,
                  args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """One ``ControlPlane`` call of an attached store, on its own FC-MAS queue; its
    loads and stores in flight are kept for its lease. ``servable`` with ``wait_s``
    may answer a ``ServableWait`` for the service to hold."""
    if method not in wire.CONTROL_CALLS:
        raise wire.NodeRefused(f"unknown control call {method!r}")
    store.handed = ()  # punched before this call
    if method == wire.SERVABLE:
        keys, engine_blocks = tuple(args[0]), int(kwargs.get("engine_blocks", 0))
        found = servable(control, keys, engine_blocks)
        wait_s = float(kwargs.get("wait_s", 0.0))
        if not (math.isfinite(wait_s) and wait_s >= 0):  # its deadline times the loop
            raise wire.NodeRefused(f"servable: wait_s must be finite and >= 0, got {wait_s}")
        if found.wait and wait_s > 0:
            return ServableWait(store.client_id, keys, engine_blocks,
                                store.last_call + wait_s)
        return found
    if method in wire.FCMAS_CALLS:
        kwargs = {**kwargs, "queue": store.client_id}
    out = getattr(control, method)(*args, **kwargs)
    if method == "prepare_load":
        store.loads.add(args[0])
        # The planner the store passed records the stream it planned: it goes back.
        return out, kwargs.get("planner")
    if method == "complete_load":
        store.loads.discard(args[0])
    elif method == "prepare_store" and out is not None:
        store.stores[out.segment.segment_id] = out
    elif method == "complete_store":
        store.stores.pop(args[0].segment.segment_id, None)
    elif method == "take_window_releases":
        store.handed = tuple(out)
    return out


def release_store(store: AttachedStore, control: ControlPlane | None, why: str) -> None:
    """Its lease ended (or it detached): its restores unpinned, its unfinished writes
    rolled back (never published), its FC-MAS queue gone, the window releases it may
    not have punched handed out again."""
    busy = bool(store.loads or store.stores)
    if control is not None:
        control.give_back_window_releases(store.handed)
        for request_id in store.loads:
            control.complete_load(request_id)
        for plan in store.stores.values():
            control.complete_store(plan, False)
        control.drop_restore_queue(store.client_id)
    (logger.warning if busy else logger.info)(
        "store %s (%s, pid %d) %s%s", store.client_id, store.name, store.pid, why,
        ": its restores unpinned, its unfinished writes rolled back" if busy else "")
