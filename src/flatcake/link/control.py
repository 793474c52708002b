"""The node service's books seen from an attached ``FlatCakeStore``: ``RemoteControl``
answers the ``ControlPlane`` verbs and queries the store and the request protocol
(``plan.requests``) call, each one call to the service, which runs them on the node's
one ``ControlPlane``. FC-MAS is this store's own queue there. What the store reads
without asking (geometry, configuration, clock) is kept here.

The values cross pickled: a plan handed back (``complete_store(plan, ok)``) is matched
by equality there, not identity.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from flatcake.clock import Clock
from flatcake.config import FlatCakeConfig
from flatcake.geometry import KVGeometry
from flatcake.link import wire
from flatcake.link.client import NodeClient
from flatcake.link.wire import Attached


class RemoteControl:
    """``ControlPlane``'s methods, answered by the node service (see the module)."""

    def __init__(self, node: str, timeout_s: float, geometry: KVGeometry, clock: Clock,
                 name: str) -> None:
        self._client = NodeClient(node, timeout_s)
        self._name = name
        self.geometry, self.clock = geometry, clock
        got = self._attach()
        self.config: FlatCakeConfig = got.config
        self.node_id = self.config.store.node_id
        self.recovered_segments = got.recovered_segments

    def _attach(self) -> Attached:
        got: Attached = self._client.call(wire.ATTACH_STORE, "", self._name, os.getpid(),
                                          self.geometry)
        self._id = got.engine_id
        return got

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_") or name not in wire.CONTROL_CALLS:
            raise AttributeError(f"RemoteControl has no {name!r} (not a call the node "
                                 "service answers)")

        def ask(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            try:
                return self._client.call(wire.CONTROL, self._id, name, args, kwargs)
            except wire.NodeRefused as exc:
                if wire.UNKNOWN_ENGINE not in str(exc):
                    raise
            # Forgotten (an idle lease ended, or the service restarted): what it held
            # there is void; attach again and ask once more.
            self._attach()
            return self._client.call(wire.CONTROL, self._id, name, args, kwargs)

        def call(*args: Any, **kwargs: Any) -> Any:
            if name != "prepare_load":
                return ask(args, kwargs)
            # The planner ran there: what it recorded (the stream) comes back into ours.
            plan, planner = ask(args, kwargs)
            mine = kwargs.get("planner")
            if mine is not None and planner is not None:
                vars(mine).update(vars(planner))
            return plan

        call.__name__ = name
        return call

    def close(self) -> None:
        with contextlib.suppress(wire.NodeUnavailable, wire.NodeRefused):
            self._client.call(wire.DETACH, self._id)
        self._client.close()
