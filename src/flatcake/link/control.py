"""The node service's books seen from an attached ``FlatCakeStore``: ``RemoteControl``
answers the ``ControlPlane`` verbs and queries the store and the request protocol
(``plan.requests``) call, each one call to the service, which runs them on the node's
one ``ControlPlane``; ``servable`` is the protocol's step in one call, and
``wait_servable`` a call the service holds while a store in flight writes the blocks
after the hit. FC-MAS is this store's own queue there. What the store reads without
asking (geometry, configuration, clock) is kept here.

The values cross as data of declared types (``link.verbs``): a plan handed back
(``complete_store(plan, ok)``) is matched by equality there, not identity;
``prepare_load``'s planner stays here (the service plans with its own stream planner
and what it recorded is written into this one).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from flatcake.clock import Clock
from flatcake.config import FlatCakeConfig
from flatcake.control import PrefixHit
from flatcake.control.types import LoadPlan
from flatcake.geometry import KVGeometry
from flatcake.link import verbs, wire
from flatcake.link.client import NodeClient
from flatcake.link.wire import Attached
from flatcake.plan.requests import Servable
from flatcake.plan.stream import StreamPlanner


class RemoteControl:
    """``ControlPlane``'s methods, answered by the node service (see the module)."""

    def __init__(self, node: str, timeout_s: float, geometry: KVGeometry, clock: Clock,
                 name: str, tenant: bytes = b"", group: str = "") -> None:
        self._client = NodeClient(node, timeout_s, group)  # used under the store's lock
        self._waiters = threading.local()  # each waiting thread's own NodeClient
        self._waiters_lock = threading.Lock()
        self._waiter_clients: list[NodeClient] = []
        self._name = name
        self._tenant = tenant  # its key salt's tag: the service scopes its sessions by it
        self.geometry, self.clock = geometry, clock
        got = self._attach()
        self.config: FlatCakeConfig = got.config
        self.node_id = self.config.store.node_id
        self.recovered_segments = got.recovered_segments

    def _attach(self) -> Attached:
        got: Attached = self._client.call(verbs.ATTACH_STORE, "", self._name, os.getpid(),
                                          self.geometry, self._tenant)
        self._id = got.engine_id
        return got

    def _attach_again(self) -> str:
        return self._attach().engine_id

    def servable(self, keys: Sequence[bytes], engine_blocks: int = 0) -> Servable:
        """``plan.requests.servable`` in one call."""
        found: Servable = self._client.call_as(
            self._id, self._attach_again, verbs.SERVABLE, tuple(keys),
            engine_blocks=engine_blocks)
        return found

    def wait_servable(self, keys: Sequence[bytes], wait_s: float) -> None:
        """Wait until no store in flight (of any process) writes the blocks right after
        the hit of ``keys``, at most ``wait_s``: the service answers once the store is
        durable, failed or rolled back. On a socket of the calling thread's own, so the
        caller need not hold the store's lock (its own store in flight completes
        meanwhile); a service gone or that forgot this store ends the wait (ask
        ``servable`` again)."""
        client = getattr(self._waiters, "client", None)
        if client is None:
            client = self._waiters.client = NodeClient(
                str(self._client.path), self._client.timeout_ms / 1000, self._client.group)
            with self._waiters_lock:
                self._waiter_clients.append(client)
        with contextlib.suppress(wire.NodeUnavailable, wire.NodeRefused):
            # (engine_blocks, wait_s) of the verb; the client's own wait_s: as long
            client.call(verbs.SERVABLE, self._id, tuple(keys), 0, wait_s, wait_s=wait_s)

    def prepare_load(self, request_id: str, keys_or_hit: PrefixHit, *,
                     planner: StreamPlanner | None = None, refill: bool = False) -> LoadPlan:
        """``ControlPlane.prepare_load``: the service plans with a stream planner of its
        own when ``planner`` is one (without block crcs, as ``plan.requests`` makes it),
        and what that recorded is written into ``planner``."""
        if planner is not None and not (type(planner) is StreamPlanner
                                        and not planner.crcs):
            raise TypeError("only a StreamPlanner without block crcs plans a load "
                            f"through the node service, not {planner!r}")
        got: verbs.LoadPlanned = self._call(verbs.CONTROL["prepare_load"], request_id,
                                            keys_or_hit, planner is not None, refill)
        if planner is not None:
            planner.stream_request, planner.checks = got.stream_request, got.checks
        return got.plan

    def _call(self, verb: verbs.Verb, *args: Any, **kwargs: Any) -> Any:
        return self._client.call_as(self._id, self._attach_again, verb, *args, **kwargs)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        verb = verbs.CONTROL.get(name)
        if name.startswith("_") or verb is None:
            raise AttributeError(f"RemoteControl has no {name!r} (not a call the node "
                                 "service answers)")

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call(verb, *args, **kwargs)

        call.__name__ = name
        return call

    def close(self) -> None:
        with contextlib.suppress(wire.NodeUnavailable, wire.NodeRefused):
            self._client.call(verbs.DETACH, self._id)
        self._client.close()
        with self._waiters_lock:
            for client in self._waiter_clients:
                client.close()
