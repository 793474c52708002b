"""The node service's wire: where it listens, how a call and its answer travel, and
what an attach answers.

Transport is ZeroMQ over a unix socket (``ipc://``): a ROUTER in the service, one DEALER
per client socket. A call is one frame, ``pickle((call_id, engine_id, method, args[, deadline,
gave_up]))`` (``engine_id`` names the engine or store the call is for: the connection
that attached it, or another of the same process, ``link.trust.Owner``; ``deadline``:
the wall-clock time, ``time.time()``, past which its client no longer waits, so the
service does not run it then; ``gave_up``: this client's earlier calls it stopped
waiting for, whose effects the service undoes; ``Call``);
its answer one frame, ``pickle((call_id, ok, value))`` with ``value`` the result or, when
``ok`` is false, the error's message. Pickle carries the books' own task types as they go
to vLLM's workers; the socket's directory is 0700 and the socket 0600, so only the
service's user can connect (a peer that could would hold the store's files anyway), and a
client talks only to a socket and a listener of its own user or root (``link.trust``).
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flatcake.config import FlatCakeConfig

# The calls a client may make (anything else is refused by name).
ATTACH = "attach"
DETACH = "detach"
WORKER = "worker"
STATUS = "status"
ATTACH_STORE = "attach_store"
CONTROL = "control"
# An attached store's servable hit (``plan.requests.servable``) in one call; with
# ``wait_s`` the service answers once no store in flight writes the blocks right after
# the hit (or ``wait_s`` has passed).
SERVABLE = "servable"
# An attached store's calls of the books (``link.control.RemoteControl``); the FC-MAS
# ones run on the store's own queue.
CONTROL_CALLS = frozenset({
    "lookup", "store_in_flight", "prepare_store", "take_reclaim_actions", "complete_store",
    "complete_copy", "files_of", "file_end_bytes", "cut_pending", "settle_damage",
    "prepare_load", "complete_load", "segment", "mark_damaged", "restore_request",
    "submit_restore", "next_restores", "restore_done", "pop_ready_restore", "reclaim",
    "drop_session", "session_ids", "session", "stats", "segments", "ready_cuts",
    "newest_turn_index", "take_window_releases", SERVABLE,
})
FCMAS_CALLS = frozenset({"submit_restore", "next_restores", "restore_done",
                         "pop_ready_restore"})
# An engine's scheduler half, forwarded to its ``SchedulerSide`` in the service.
ENGINE_CALLS = frozenset({
    "new_request", "num_matched_tokens", "after_alloc", "prompt_computed", "step",
    "update", "request_finished", "take_stats",
})


# The service's answer to a call of an engine it does not know (lease ended, restart).
UNKNOWN_ENGINE = "unknown engine"
# ... and to a call naming an engine or store another connection attached.
FOREIGN_CLIENT = "is not the caller's"
# ... and to a call its client stopped waiting for (not run).
GAVE_UP = "its client stopped waiting for it"
MAX_GAVE_UP = 256  # call ids a call may name as given up


@dataclass(frozen=True, slots=True)
class Call:
    """One call as the service reads it (see the module)."""

    call_id: int
    engine_id: str
    method: str
    args: tuple[Any, ...]
    deadline: float | None = None  # wall clock (time.time()); None: no deadline
    gave_up: tuple[int, ...] = ()

    @classmethod
    def parse(cls, obj: Any) -> Call:
        """The call ``obj`` (an unpickled frame) is; ``ValueError`` naming what is
        wrong."""
        shape = ("not (call_id: int, engine_id: str, method: str, args: tuple"
                 "[, deadline: float | None, gave_up: tuple of int])")
        if not (isinstance(obj, tuple) and len(obj) in (4, 6)):
            raise ValueError(shape)
        call = cls(*obj)
        if not (isinstance(call.call_id, int) and isinstance(call.engine_id, str)
                and isinstance(call.method, str) and isinstance(call.args, tuple)
                and (call.deadline is None or isinstance(call.deadline, float | int))
                and isinstance(call.gave_up, tuple) and len(call.gave_up) <= MAX_GAVE_UP
                and all(isinstance(c, int) for c in call.gave_up)):
            raise ValueError(shape)
        return call


class NodeUnavailable(ConnectionError):
    """The node service did not answer in time (down, restarting, or overloaded)."""


class NodeRefused(ValueError):
    """The node service answered with an error (a bad call, an engine it refuses)."""


def socket_path(node: str) -> Path:
    """The socket file of ``store.node`` (``unix:PATH``, ``ipc://PATH`` or ``PATH``)."""
    for prefix in ("unix://", "unix:", "ipc://"):
        if node.startswith(prefix):
            node = node[len(prefix):]
            break
    if not node:
        raise ValueError("store.node is empty: name the node service's socket "
                         "(unix:/run/flatcake/node.sock)")
    return Path(node)


def endpoint(path: Path) -> str:
    return f"ipc://{os.path.abspath(path)}"


def encode(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> Any:
    return pickle.loads(data)  # a 0600 socket of the service's own user


@dataclass(frozen=True, slots=True)
class Attached:
    """What an engine's scheduler half learns when it attaches."""

    engine_id: str
    config: FlatCakeConfig
    recovered_segments: int


@dataclass(frozen=True, slots=True)
class TensorRanks:
    """An engine's tensor-parallel ranks and how its KV spreads over them. Each rank
    holds its own part of every block (attention heads split over the ranks): a block
    is one entry in the books whose parts lie at the same offsets of the same file in
    each part's directory, each written and read by its rank. ``replicated``: every
    rank holds the same bytes (MLA's latent, one per token, not split by heads): one
    part, written by rank 0 and read by every rank."""

    world_size: int = 1
    replicated: bool = False

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"TensorRanks.world_size must be >= 1, got {self.world_size}")
        if self.world_size == 1:  # one rank: nothing to replicate (one layout, one name)
            object.__setattr__(self, "replicated", False)

    @property
    def parts(self) -> int:
        """Distinct parts of a block, each in its own store directory."""
        return 1 if self.replicated else self.world_size

    def part(self, rank: int) -> int:
        """The part rank ``rank`` reads (and writes, when ``writes(rank)``)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} of tensor_parallel_size={self.world_size}")
        return 0 if self.replicated else rank

    def writes(self, rank: int) -> bool:
        """Whether rank ``rank`` writes its part (a replicated part: rank 0 only)."""
        return self.part(rank) == rank

    def __str__(self) -> str:
        return (f"tensor_parallel_size={self.world_size}"
                + (" (replicated KV)" if self.replicated else ""))


@dataclass(frozen=True, slots=True)
class WorkerRoot:
    """Where a worker of tensor-parallel rank ``rank`` runs its tasks; ``writes``: False
    for a rank whose replicated part another rank writes (it only reads); ``part`` of
    ``parts``: the part of every block it reads (and of remote segments, in a cluster)."""

    store_dir: Path
    arena_path: Path
    config: FlatCakeConfig
    writes: bool = True
    part: int = 0
    parts: int = 1
