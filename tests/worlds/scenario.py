"""The script every world runs, and what each world records of it.

Five phases, one global clock (no session ids: every world infers sessions from the
books with ``control.signals``), requests far apart except in the two bursts:

1. ``a``, ``b``, ``c`` (the old two-worlds scenario): three conversations share a
   system prompt; short and long replies put turns in memory and on SSD; the small SSD
   makes the books reclaim the oldest conversation.
2. FC-MAS: ``d``..``g`` store a first turn each (SSD, sizes 4 / 12 / 6 / 2 blocks), then
   their second turns arrive within microseconds, in that order. One restore slot:
   ``d1`` takes it, the other three wait and start by priority ``1 + wait / kv_bytes``
   (the smallest first: ``g1``, ``f1``, ``e1``), not by arrival.
3. Damage: ``h`` writes two SSD segments into one file (turn 1's 36 new blocks, a
   520-token reply re-sent, do not fit in host memory); between turns the second one
   rots; a branch ``hx`` (``h``'s turn-1 prompt but its last block, then its own
   blocks: a session of its own in every world) reads it.
4. Header damage: ``k`` likewise, but its file header rots too before ``kx`` reads.
5. Remote: ``s0`` puts the system prompt on node 0's SSD again; ``r0`` runs on node 1
   (the system prompt, read from node 0, and 5 blocks of its own, stored there); then
   on node 0 ``x1``, ``r1``, ``q1`` arrive within microseconds: ``r1`` hits the system
   prompt here and its 5 blocks on node 1, a restore with a remote part that waits
   behind ``x1``'s for the slot, next to ``q1``'s local one (6 blocks: between the
   local part alone and the whole restore, so how a world weighs the remote part
   decides which of the two starts first).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from flatcake.control.scheduler import MasScheduler, RestoreRequest
from flatcake.geometry import KVGeometry
from flatcake.replay.workload.trace import Workload, from_requests
from tests.replay.helpers import GEOMETRY, ids

BT = GEOMETRY.tokens_per_block
# 16 tokens x (K+V) x 1 head x 80 dims x 2 bytes = 5 KiB per block per layer: every read
# command carries O_DIRECT alignment padding.
PADDED = KVGeometry(num_layers=4, tokens_per_block=BT, num_kv_heads=1, head_dim=80,
                    name="tiny-padded")
SYSTEM = ids(0, 3)  # the system prompt a, b, c, s and r share
SHORT, MID, LONG = 20, 520, 40 * BT  # replies: short (< 512 tokens), default, long
BURST_S = 1e-6  # arrivals inside a burst: far shorter than any restore
PHASES = ("two-worlds", "fc-mas", "damage", "header-damage", "remote")


@dataclass(frozen=True, slots=True)
class Step:
    """One request of the script: ``name`` is its conversation and turn (``"a1"``) or a
    branch (``"hx"``); ``phase`` one of ``PHASES``; ``node`` the node it runs on."""

    name: str
    phase: str
    at_s: float
    blocks: tuple[int, ...]
    input_tokens: int
    output_tokens: int
    node: int = 0


@dataclass(frozen=True, slots=True)
class Rot:
    """Before request ``before`` arrives, the segment request ``victim`` stored rots on
    disk (one byte of its layer 1); with ``header`` its file header rots too."""

    before: str
    victim: str
    header: bool = False


def _conversation(name: str, phase: str, prefix: list[int], first: int,
                  turns: list[tuple[float, int, int]]) -> list[Step]:
    """Turns ``(at_s, new blocks, reply tokens)``: each re-sends the history, the
    previous reply and ``new`` more blocks."""
    out = []
    history = list(prefix)
    next_id = first
    for t, (at_s, new, reply) in enumerate(turns):
        history += range(next_id, next_id + new)
        next_id += new
        out.append(Step(f"{name}{t}", phase, at_s, tuple(history), len(history) * BT,
                        reply))
        reply_blocks = -(-reply // BT)
        history += range(next_id, next_id + reply_blocks)
        next_id += reply_blocks
    return out


def _branch(name: str, of: Step, at_s: float, first: int, new: int) -> Step:
    """A request sharing ``of``'s prompt but its last block, then ``new`` blocks of its
    own: it does not extend ``of``'s session, so it starts its own in every world."""
    blocks = (*of.blocks[:-1], *range(first, first + new))
    return Step(name, of.phase, at_s, blocks, len(blocks) * BT, SHORT)


def _steps() -> list[Step]:
    conv = _conversation
    # Phase 1: a, b, c interleaved turn by turn, 10 s apart.
    p = "two-worlds"
    a = conv("a", p, SYSTEM, 100, [(0, 4, SHORT), (30, 2, LONG), (60, 3, SHORT),
                                   (90, 2, SHORT)])
    b = conv("b", p, SYSTEM, 1000, [(10, 2, LONG), (40, 5, SHORT), (70, 2, SHORT)])
    c = conv("c", p, SYSTEM, 2000, [(20, 6, SHORT), (50, 1, SHORT), (80, 4, LONG),
                                    (100, 2, SHORT)])
    # Phase 2: four first turns, then their second turns in one burst.
    p, t = "fc-mas", 150.0
    d = conv("d", p, [], 3000, [(110, 4, SHORT), (t, 1, SHORT)])
    e = conv("e", p, [], 3100, [(120, 12, SHORT), (t + BURST_S, 1, SHORT)])
    f = conv("f", p, [], 3200, [(130, 6, SHORT), (t + 2 * BURST_S, 1, SHORT)])
    g = conv("g", p, [], 3300, [(140, 2, SHORT), (t + 3 * BURST_S, 1, SHORT)])
    # Phases 3 and 4: two SSD segments in one file each, then a branch reads both.
    h = conv("h", "damage", [], 4000, [(160, 4, MID), (170, 3, SHORT)])
    k = conv("k", "header-damage", [], 5000, [(190, 3, MID), (200, 2, SHORT)])
    hx = _branch("hx", h[1], 180, 4500, 2)
    kx = _branch("kx", k[1], 210, 5500, 2)
    # Phase 5: the system prompt on node 0, r's first turn on node 1, then a burst on
    # node 0 restores r's history from both with x's and q's.
    p, t = "remote", 250.0
    s = conv("s", p, SYSTEM, 6300, [(220, 2, SHORT)])
    x = conv("x", p, [], 6000, [(225, 5, SHORT), (t, 1, SHORT)])
    q = conv("q", p, [], 6100, [(230, 6, SHORT), (t + 2 * BURST_S, 1, SHORT)])
    r = conv("r", p, SYSTEM, 6200, [(240, 5, SHORT), (t + BURST_S, 1, SHORT)])
    r[0] = dataclasses.replace(r[0], node=1)
    steps = [*a, *b, *c, *d, *e, *f, *g, *h, *k, hx, kx, *s, *x, *q, *r]
    return sorted(steps, key=lambda st: st.at_s)


@dataclass(frozen=True)
class Script:
    """The steps in arrival order (request ``i`` is ``steps[i]``) and the rot."""

    steps: tuple[Step, ...]
    rots: tuple[Rot, ...]

    def index(self, name: str) -> int:
        return next(i for i, s in enumerate(self.steps) if s.name == name)

    def names(self, indices: list[int]) -> list[str]:
        return [self.steps[i].name for i in indices]

    def phase(self, phase: str) -> set[int]:
        return {i for i, s in enumerate(self.steps) if s.phase == phase}

    def readers_of_rot(self) -> set[int]:
        return {self.index(r.before) for r in self.rots}

    def rot_before(self, i: int) -> Rot | None:
        name = self.steps[i].name
        return next((r for r in self.rots if r.before == name), None)

    def workload(self) -> Workload:
        return from_requests([(s.at_s, list(s.blocks), s.input_tokens, s.output_tokens)
                              for s in self.steps], BT, name="three-worlds")


def script() -> Script:
    return Script(tuple(_steps()), (Rot("hx", "h1"), Rot("kx", "k1", header=True)))


@dataclass
class Record:
    """What one world decided, by request index (``Script.steps``).

    Attributes:
        placed: per stored turn ``(session, medium, rule)``; None: nothing new stored.
        stored_blocks: blocks of the segment each turn stored.
        segment_of: the segment id each turn stored.
        hits: the hit each request was served ``(blocks, memory, ssd, remote)``
            (memory and SSD: this node's; remote: blocks other nodes sent).
        reads: local SSD ``(commands, bytes)`` of each restore that read the SSD.
        remote_bytes: bytes other nodes sent, per restore with a remote part.
        weights: FC-MAS ``kv_bytes`` of each restore queued for a slot (needs_ssd).
        started: FC-MAS's order of starting those restores (both nodes, in time order).
        after_rot: per rotted victim, after the request that read it stored its turn:
            the victim session's segment ids still in the books.
        on_disk: per rotted victim (store and connector only): the size of its file
            in ``sessions/`` (-1: gone) and the files in ``quarantine/``.
        file_of: the session file each SSD turn went to.
        accounted: replay only, per restore: SSD bytes read (by this node and the
            owners of its remote part), wanted, read for checksums, gap bytes.
    """

    placed: dict[int, tuple[str, str, str] | None] = field(default_factory=dict)
    stored_blocks: dict[int, int] = field(default_factory=dict)
    segment_of: dict[int, int] = field(default_factory=dict)
    hits: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)
    reads: dict[int, tuple[int, int]] = field(default_factory=dict)
    remote_bytes: dict[int, int] = field(default_factory=dict)
    weights: dict[int, int] = field(default_factory=dict)
    started: list[int] = field(default_factory=list)
    after_rot: dict[str, list[int]] = field(default_factory=dict)
    on_disk: dict[str, tuple[int, int]] = field(default_factory=dict)
    file_of: dict[int, int] = field(default_factory=dict)
    accounted: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)


def tap_fc_mas(sched: MasScheduler, rec: Record,
               index_of: Callable[[Hashable], int | None]) -> None:
    """Record what FC-MAS ``sched`` is given and decides (instance wrappers): the weight
    of every restore that waits for a slot and the order they start."""
    submit, next_restores = sched.submit, sched.next_restores

    def submitting(req: RestoreRequest) -> None:
        i = index_of(req.request_id)
        if i is not None and req.needs_ssd:
            rec.weights[i] = req.kv_bytes
        submit(req)

    def starting() -> list[RestoreRequest]:
        started = next_restores()
        rec.started.extend(i for r in started if (i := index_of(r.request_id)) is not None)
        return started

    sched.submit = submitting
    sched.next_restores = starting
