"""The node service's wire: where it listens, how a call and its answer travel, and
what an attach answers.

Transport is a unix stream socket (``link.frames``: each frame its length, then its
bytes; one connection per client socket). A call is one frame, its answer one frame,
each a msgpack array
decoded into declared types only (msgspec): nothing a peer sends is unpickled, on
either side, so a peer's bytes can make a value of a declared type or an error, never
run code. The verbs, with their arguments' and answers' types, are ``link.verbs``::

    call (client -> service)
    +---------+---------+-----------+------+------+----------+---------+
    | version | call_id | client_id | verb | args | deadline | gave_up |
    +---------+---------+-----------+------+------+----------+---------+
      int       int       str         str    the    float |    [int]
                                             verb's  nil       (<= MAX_GAVE_UP)
                                             Args

    answer (service -> client)
    +---------+----+-------+-------+
    | call_id | ok | value | error |
    +---------+----+-------+-------+
      int|nil   bool  the     str
                      verb's
                      reply

``version``: ``PROTOCOL_VERSION`` of the client; a call of another version is refused
by name before anything else of it is read (an attach of an older or newer client
included). ``client_id`` names the engine or store the call is for (the connection that
attached it, or another of the same process, ``link.trust.Owner``); ``deadline``: the
wall-clock time, ``time.time()``, past which its client no longer waits, so the service
does not run it then; ``gave_up``: this client's earlier calls it stopped waiting for,
whose effects the service undoes. ``args`` is decoded only once ``verb`` is known, into
that verb's ``Args``; ``value`` (when ``ok``) into its reply type; ``error`` is the
message of a refusal. A frame that does not decode is refused with its ``call_id``
where it names one (another protocol version), else nil.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgspec

from flatcake.config import FlatCakeConfig

# Bumped whenever a frame or a verb's types change; a mismatch is refused by name.
# 5: frames on a unix stream socket (link.frames); no complete_copy. 6: an engine's
# admissions ride with its next lookup or step; an update answers the params of the
# loads it ended (``connectors.node_verbs``). 7: a lookup answers whether the books hold
# the whole prompt (the step computing it then leaves it out).
PROTOCOL_VERSION = 7

# The service's answer to a call of an engine it does not know (lease ended, restart).
UNKNOWN_ENGINE = "unknown engine"
# ... and to a call naming an engine or store another connection attached.
FOREIGN_CLIENT = "is not the caller's"
# ... and to a call its client stopped waiting for (not run).
GAVE_UP = "its client stopped waiting for it"
# ... and to a call of another protocol version.
OTHER_VERSION = "protocol version"
MAX_GAVE_UP = 256  # call ids a call may name as given up


class Call(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """One call (see the module's map); ``args`` still encoded."""

    version: int
    call_id: int
    client_id: str
    verb: str
    args: msgspec.Raw
    deadline: float | None = None  # wall clock (time.time()); None: no deadline
    gave_up: Annotated[tuple[int, ...], msgspec.Meta(max_length=MAX_GAVE_UP)] = ()


class _Head(msgspec.Struct, array_like=True):
    """A frame's first two items, whatever follows (skipped, never built)."""

    version: Any = None
    call_id: Any = None


class Reply(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """One answer (see the module's map); ``value`` still encoded."""

    call_id: int | None
    ok: bool
    value: msgspec.Raw = msgspec.Raw(b"\xc0")  # nil
    error: str = ""


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    item = getattr(obj, "item", None)  # a numpy scalar
    if callable(item) and getattr(obj, "shape", None) == ():
        return item()
    raise TypeError(f"{type(obj).__name__} does not cross the node service's wire")


def _dec_hook(typ: type, obj: Any) -> Any:
    if typ is object:  # a field of any plain value: msgpack's own (str, int, list, ...)
        return obj
    if typ is Path and isinstance(obj, str):
        return Path(obj)
    if typ is Hashable and isinstance(obj, str | int | bytes):  # a request id
        return obj
    raise TypeError(f"{typ} does not cross the node service's wire")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_CALLS = msgspec.msgpack.Decoder(Call)
_REPLIES = msgspec.msgpack.Decoder(Reply)
_HEADS = msgspec.msgpack.Decoder(_Head)  # for naming what is wrong with a frame

# A frame that does not decode (``decode_call``, ``Decoder.decode``) raises one of these.
FrameError = (msgspec.DecodeError, msgspec.ValidationError)


def encode(obj: Any) -> bytes:
    """``obj`` (a frame, a verb's arguments or reply) as msgpack."""
    return _ENCODER.encode(obj)


def decoder(typ: Any) -> msgspec.msgpack.Decoder[Any]:
    """A decoder of msgpack into ``typ`` (only): raises one of ``FrameError``."""
    return msgspec.msgpack.Decoder(typ, dec_hook=_dec_hook)


class BadFrame(ValueError):
    """A frame that is not a call of this protocol version (the message says why);
    ``call_id`` where the frame names one."""

    def __init__(self, why: str, call_id: int | None = None) -> None:
        super().__init__(why)
        self.call_id = call_id


def decode_call(frame: bytes) -> Call:
    """The call ``frame`` holds; ``BadFrame`` naming what is wrong (another protocol
    version by name: ``OTHER_VERSION``)."""
    try:
        call = _CALLS.decode(frame)
    except FrameError as exc:
        other, call_id = _other_version(frame)
        raise BadFrame(other or f"not a call: {exc}", call_id) from None
    if call.version != PROTOCOL_VERSION:
        raise BadFrame(_other_version(frame)[0], call.call_id)
    return call


def _other_version(frame: bytes) -> tuple[str, int | None]:
    """('', None) unless ``frame`` is an array whose first item is another protocol
    version: then what to answer, and the call id its second item may be."""
    try:
        head = _HEADS.decode(frame)
    except FrameError:
        return "", None
    if type(head.version) is not int or head.version == PROTOCOL_VERSION:
        return "", None
    call_id = head.call_id if type(head.call_id) is int else None
    return (f"{OTHER_VERSION} {head.version} of the client; this node service speaks "
            f"{OTHER_VERSION} {PROTOCOL_VERSION}: run one FlatCake version on both "
            "sides"), call_id


def call_frame(call_id: int, client_id: str, verb: str, args: Any,
               deadline: float | None = None, gave_up: tuple[int, ...] = ()) -> bytes:
    """A call of ``verb`` with ``args`` (its verb's ``Args``) as its frame."""
    return _ENCODER.encode(Call(PROTOCOL_VERSION, call_id, client_id, verb,
                                msgspec.Raw(_ENCODER.encode(args)), deadline, gave_up))


def answer_frame(call_id: int | None, value: Any) -> bytes:
    """The answer ``value`` (its verb's reply type) to call ``call_id`` as its frame."""
    return _ENCODER.encode(Reply(call_id, True, msgspec.Raw(_ENCODER.encode(value))))


def refusal_frame(call_id: int | None, error: str) -> bytes:
    """The refusal of call ``call_id`` (``error`` says why) as its frame."""
    return _ENCODER.encode(Reply(call_id, False, error=error))


def decode_reply(frame: bytes) -> Reply:
    """The answer ``frame`` holds (raises one of ``FrameError``)."""
    return _REPLIES.decode(frame)


class NodeUnavailable(ConnectionError):
    """The node service did not answer in time (down, restarting, or overloaded)."""


class NodeRefused(ValueError):
    """The node service answered with an error (a bad call, an engine it refuses)."""


def socket_path(node: str) -> Path:
    """The socket file of ``store.node`` (``unix:PATH``, ``ipc://PATH`` or ``PATH``;
    ``ipc://``, ZeroMQ's, as older configurations name it)."""
    for prefix in ("unix://", "unix:", "ipc://"):
        if node.startswith(prefix):
            node = node[len(prefix):]
            break
    if not node:
        raise ValueError("store.node is empty: name the node service's socket "
                         "(unix:/run/flatcake/node.sock)")
    return Path(node)


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
