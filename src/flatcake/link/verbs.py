"""The node service's verbs with their declared types: what each call's arguments are
(a msgspec Struct whose fields are the called method's parameters) and what it answers.
The service decodes a call's ``args`` into its verb's ``Args`` and nothing else, the
client decodes an answer into its verb's reply type (``link.wire`` has the frames).

Three families: the service's own (attach a store, a worker's files, status, detach);
an attached store's calls of the books (``CONTROL``: ``ControlPlane``'s verbs and
queries, and ``servable``, ``begin_store`` and ``end_store``, the request protocol's
steps in one call each); an engine's scheduler half (``connectors.node_verbs``: they
name the connectors' types).

No object with behaviour crosses: ``prepare_load``'s stream planner is built by the
service from ``stream`` (``plan.stream.StreamPlanner`` without block crcs) and what it
recorded comes back as data (``LoadPlanned``), which the client writes into its own.
"""

from __future__ import annotations

from typing import Any

import msgspec

from flatcake.control import PrefixHit, RestoreRequest, Segment, StorePlan
from flatcake.control.sessions import SessionRecord
from flatcake.control.types import ControlStats, LoadPlan, ReclaimAction, WindowRelease
from flatcake.geometry import KVGeometry
from flatcake.link import wire
from flatcake.link.wire import Attached, TensorRanks, WorkerRoot
from flatcake.plan.requests import Servable, StoreBegun, StoreEnded
from flatcake.plan.stream import StreamCheck


class Verb:
    """One verb: its name, its arguments' Struct (``args``) and its reply type."""

    def __init__(self, name: str, reply: Any, *fields: tuple[Any, ...]) -> None:
        self.name = name
        self.reply = reply
        self.args: type[msgspec.Struct] = msgspec.defstruct(
            f"{name}_args", list(fields), array_like=True, frozen=True,
            forbid_unknown_fields=True)
        self.fields: tuple[str, ...] = tuple(f[0] for f in fields)
        self._args = wire.decoder(self.args)
        self._reply = wire.decoder(reply)

    def encode_args(self, *args: Any, **kwargs: Any) -> msgspec.Struct:
        """The call's arguments as this verb's Struct (``TypeError`` for others)."""
        return self.args(*args, **kwargs)

    def decode_args(self, raw: bytes) -> dict[str, Any]:
        """The arguments of a call (by parameter name); raises one of
        ``wire.FrameError`` for bytes that are not this verb's arguments."""
        got = self._args.decode(raw)
        return {name: getattr(got, name) for name in self.fields}

    def decode_reply(self, raw: bytes) -> Any:
        return self._reply.decode(raw)


def table(*verbs: Verb) -> dict[str, Verb]:
    return {v.name: v for v in verbs}


class LoadPlanned(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """``prepare_load``'s answer: the plan, and what its stream planner recorded."""

    plan: LoadPlan
    stream_request: list[int]
    checks: list[StreamCheck]


# The service's own verbs.
ATTACH_STORE = Verb("attach_store", Attached, ("name", str), ("pid", int),
                    ("geometry", KVGeometry), ("tenant", bytes, b""))
WORKER = Verb("worker", WorkerRoot, ("rank", int), ("geometry", KVGeometry),
              ("ranks", TensorRanks))
STATUS = Verb("status", dict[str, Any])
DETACH = Verb("detach", None)
SERVICE = table(ATTACH_STORE, WORKER, STATUS, DETACH)

# An attached store's servable hit (``plan.requests.servable``) in one call; with
# ``wait_s`` the service answers once no store in flight writes the blocks right after
# the hit (or ``wait_s`` has passed).
SERVABLE = Verb("servable", Servable, ("keys", tuple[bytes, ...]), ("engine_blocks", int, 0),
                ("wait_s", float, 0.0))
_SESSION = ("session_id", str)
_REQUEST = ("request_id", str)
_STORE = (_SESSION, ("keys", tuple[bytes, ...]), ("turn_index", int), ("context_tokens", int),
          ("prev_reply_tokens", int | None, None), ("shared_refcount", int, 1))
# An attached store's calls of the books (``link.control.RemoteControl``).
CONTROL = table(
    SERVABLE,
    Verb("lookup", PrefixHit, ("keys", tuple[bytes, ...])),
    Verb("store_in_flight", bool, ("key", bytes)),
    Verb("prepare_store", StorePlan | None, *_STORE),
    # ``plan.requests.begin_store``: settle, prepare_store, take_reclaim_actions in one.
    Verb("begin_store", StoreBegun, *_STORE),
    Verb("complete_store", None, ("plan", StorePlan), ("ok", bool)),
    # ``plan.requests.end_store``: the copy told, complete_store, the window rows
    # released punched by the service, in one; None for a store no longer the caller's.
    Verb("end_store", StoreEnded | None, ("plan", StorePlan), ("ok", bool),
         ("copied", bool, False)),
    Verb("take_reclaim_actions", list[ReclaimAction]),
    Verb("files_of", list[int], _SESSION),
    Verb("file_end_bytes", int, ("file_id", int)),
    Verb("cut_pending", bool, _SESSION),
    Verb("settle_damage", list[ReclaimAction]),
    Verb("prepare_load", LoadPlanned, _REQUEST, ("keys_or_hit", PrefixHit),
         ("stream", bool, False), ("refill", bool, False)),
    Verb("complete_load", None, _REQUEST, ("refilled", tuple[int, ...], ())),
    Verb("segment", Segment, ("segment_id", int)),
    Verb("mark_damaged", bool, ("segment_id", int), ("header_damaged", bool, False)),
    Verb("restore_request", RestoreRequest, _REQUEST, ("arrival_time", float),
         ("plan", LoadPlan | None), ("remote_blocks", int, 0)),
    Verb("submit_restore", None, ("plan", LoadPlan), ("remote_blocks", int, 0)),
    Verb("next_restores", list[RestoreRequest]),
    Verb("restore_done", None, _REQUEST),
    Verb("pop_ready_restore", RestoreRequest | None),
    Verb("reclaim", list[ReclaimAction]),
    Verb("drop_session", ReclaimAction, _SESSION),
    Verb("session_ids", list[str]),
    Verb("session", SessionRecord, _SESSION),
    Verb("stats", ControlStats),
    Verb("segments", list[Segment]),
    Verb("ready_cuts", list[tuple[str, Segment]]),
    Verb("newest_turn_index", int, _SESSION),
    Verb("take_window_releases", list[WindowRelease]),
)
# The FC-MAS verbs: run on the calling store's own queue in the service.
FCMAS = frozenset({"submit_restore", "next_restores", "restore_done", "pop_ready_restore"})
