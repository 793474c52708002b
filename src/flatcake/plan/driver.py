"""The request driver: one request's restore through the books, with one transition table.

Every host (the store's restores, the vLLM scheduler half, and through it the node
service's engines, and the replay's FlatCake system) drives a request the same way
(``RequestDriver``); the host adds only its lock, its engine steps and its data plane
(the replay: its simulated clock, engine and devices, one driver per worker, each over
that worker's FC-MAS queue, its requests named by their trace index). A host that keeps
no books mirrors the phases another's driver reports in the same table
(``RequestTable``: the node service's engine client, ``connectors.node_client``)::

       admit         plan          start          report           release
    ───────► ADMITTED ────► QUEUED ────► STARTED ────► REPORTED ────► RELEASED
                              ▲                                          │
                              └──── plan (preempted, admitted anew) ─────┘

* **plan**: the books planned the load; it runs in the next step (``plan``,
  ``in_step``) or waits in FC-MAS, weighed by the books (``plan``) or by a host that
  gives its own arrival time and weight (``submit``: the replay, whose requests with
  nothing to load, or loaded with their prefill, wait in the ready queue too).
* **start**: a load in the step starts with the step (``take_step``, in FC-MAS's order);
  an SSD restore when FC-MAS gives it a slot (``start_restores``); a load FC-MAS puts
  straight into its ready queue (all in memory) when it leaves it (``pop_ready``, or
  one at a time: ``pop_next``).
* **report**: the workers' reports are gathered (``gather``) until all ``world_size``
  came; then ``reported``: a restore that held an FC-MAS slot gives it back and waits
  in the ready queue (released in its order by ``pop_ready``); any other is released
  at once.
* **finish**: the engine is done with the request. Admitted or released: forgotten. In
  flight (queued, started, reported): its load runs on (never cancelled), and it is
  forgotten once released; ``get`` no longer sees it.
* **abandon**: the host is gone or closing: every request is forgotten from any phase
  (the host unpins or fences what was in flight).
* **late reads**: a load given up at its deadline (``LoadDone.late``) may still be
  reading; a count per request, kept past the request's end until every worker says
  its reads ended (``count_late``, ``disk_late``).

Any other step raises ``IllegalTransition`` naming the request, its phase and the step.
Pure: the books and FC-MAS only, no I/O; single-threaded (the host serialises calls).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from typing_extensions import TypeVar as DefaultTypeVar

from flatcake.control.plane import ControlPlane
from flatcake.control.scheduler import MasScheduler, RestoreRequest
from flatcake.control.types import LoadPlan
from flatcake.plan.requests import remote_blocks
from flatcake.plan.tasks import LoadDone, LoadTask

__all__ = ["TRANSITIONS", "Event", "IllegalTransition", "Phase", "RequestDriver",
           "RequestTable", "Tracked"]

B = TypeVar("B")
# The hosts' request ids: the engines' strings unless a host names them otherwise
# (the replay: trace indices).
K = DefaultTypeVar("K", bound=Hashable, default=str)


class Phase(enum.Enum):
    """Where a request's restore is (module docstring)."""

    ADMITTED = "admitted"
    QUEUED = "queued"
    STARTED = "started"
    REPORTED = "reported"
    RELEASED = "released"
    FINISHED = "finished"  # forgotten: never held by the driver

    # Members are singletons: hashed by identity, in C (``Enum``'s hashes the name in
    # Python, and every step of the table hashes a phase and an event).
    __hash__ = object.__hash__


class Event(enum.Enum):
    """What moves a request from one phase to the next."""

    ADMIT = "admit"
    PLAN = "plan"
    START = "start"
    REPORT = "report"
    RELEASE = "release"
    FINISH = "finish"
    ABANDON = "abandon"

    __hash__ = object.__hash__  # as ``Phase``'s


P, E = Phase, Event
# The one table: (phase, event) -> next phase. What is not here is illegal.
TRANSITIONS: dict[tuple[Phase, Event], Phase] = {
    (P.FINISHED, E.ADMIT): P.ADMITTED,
    (P.ADMITTED, E.PLAN): P.QUEUED,
    (P.RELEASED, E.PLAN): P.QUEUED,
    (P.QUEUED, E.START): P.STARTED,
    (P.STARTED, E.REPORT): P.REPORTED,
    (P.REPORTED, E.RELEASE): P.RELEASED,
    (P.ADMITTED, E.FINISH): P.FINISHED,
    (P.RELEASED, E.FINISH): P.FINISHED,
    # In flight: the load runs on; forgotten once released.
    (P.QUEUED, E.FINISH): P.QUEUED,
    (P.STARTED, E.FINISH): P.STARTED,
    (P.REPORTED, E.FINISH): P.REPORTED,
    **{(phase, E.ABANDON): P.FINISHED for phase in Phase if phase is not P.FINISHED},
}
del P, E


class IllegalTransition(ValueError):
    """A host asked a request for a step its phase does not allow."""

    def __init__(self, request_id: Hashable, phase: Phase, event: Event) -> None:
        super().__init__(f"request {request_id!r} cannot {event.value} while "
                         f"{phase.value}")
        self.request_id, self.phase, self.event = request_id, phase, event


@dataclass(slots=True)
class Tracked(Generic[B, K]):
    """One request the driver holds.

    Attributes:
        request_id: the host's id of the request (an engine's string; the replay's trace
            index).
        books: the host's own books of it (the connector's ``RequestBooks``, the
            store's restore), carried along.
        phase: where its restore is.
        task: its load, from ``plan`` on (None from ``submit``: the host has no tasks).
        plan: the books' plan of that load.
        in_step: the load runs in the step (not queued in FC-MAS).
        slot: FC-MAS gave it an SSD restore slot (given back at its report).
        finished: the engine finished it while its load was in flight.
        reports: the workers' reports of its load so far.
    """

    request_id: K
    books: B
    phase: Phase = Phase.ADMITTED
    task: LoadTask | None = None
    plan: LoadPlan | None = None
    in_step: bool = False
    slot: bool = False
    finished: bool = False
    reports: list[LoadDone] = field(default_factory=list)

    @property
    def loading(self) -> bool:
        """Its load is planned and not yet reported by every worker."""
        return self.phase is Phase.QUEUED or self.phase is Phase.STARTED


class RequestTable(Generic[B, K]):
    """The requests of one host and their phases, moved only through ``TRANSITIONS``
    (no books: a host that mirrors another's driver, the node service's engine client,
    keeps its requests here)."""

    def __init__(self) -> None:
        self._reqs: dict[Hashable, Tracked[B, K]] = {}
        self._count: Counter[Phase] = Counter()

    def move(self, req: Tracked[B, K], event: Event) -> None:
        """Move ``req`` by ``event`` (``IllegalTransition`` where the table has no
        step); a finished request released is forgotten."""
        to = TRANSITIONS.get((req.phase, event))
        if to is None:
            raise IllegalTransition(req.request_id, req.phase, event)
        if req.phase is not Phase.FINISHED:
            self._count[req.phase] -= 1
        if to is Phase.RELEASED and req.finished:
            to = Phase.FINISHED
        req.phase = to
        if to is Phase.FINISHED:
            del self._reqs[req.request_id]
        else:
            self._count[to] += 1

    def get(self, request_id: K) -> Tracked[B, K] | None:
        """The live request ``request_id`` (None once the engine finished it)."""
        req = self._reqs.get(request_id)
        return None if req is None or req.finished else req

    def held(self, request_id: K) -> Tracked[B, K] | None:
        """``request_id`` while held, finished or not."""
        return self._reqs.get(request_id)

    def admit(self, request_id: K, books: B) -> Tracked[B, K]:
        """A request looked up: held from now on, with the host's ``books``."""
        req = self._reqs.get(request_id) or Tracked(request_id, books, Phase.FINISHED)
        self.move(req, Event.ADMIT)
        self._reqs[request_id] = req
        return req

    def finish(self, request_id: K) -> Tracked[B, K] | None:
        """The engine finished the request: the request as it was (None when it is
        not held live)."""
        req = self.get(request_id)
        if req is not None:
            self.move(req, Event.FINISH)
            req.finished = True
        return req

    def drop(self, request_id: K) -> Tracked[B, K] | None:
        """Forget one request from any phase (its restore failed, its host forgot it)."""
        req = self._reqs.get(request_id)
        if req is not None:
            self.move(req, Event.ABANDON)
        return req

    def abandon(self) -> list[Tracked[B, K]]:
        """Forget every request (the host is gone or closing); returns them."""
        out = list(self._reqs.values())
        for req in out:
            self.move(req, Event.ABANDON)
        return out

    def __len__(self) -> int:
        return len(self._reqs)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._reqs

    def __iter__(self) -> Iterator[Tracked[B, K]]:
        return iter(list(self._reqs.values()))

    def num(self, phase: Phase) -> int:
        """Requests in ``phase``."""
        return self._count[phase]

    @property
    def num_loading(self) -> int:
        """Loads planned and not yet reported by every worker."""
        return self._count[Phase.QUEUED] + self._count[Phase.STARTED]

    def loading(self) -> list[Tracked[B, K]]:
        """The requests whose load is planned and not yet reported."""
        return [r for r in self._reqs.values() if r.loading]


class RequestDriver(RequestTable[B, K]):
    """The requests of one host, over the books ``control`` and the FC-MAS queue
    ``queue`` (module docstring); ``world_size`` workers report every load."""

    def __init__(self, control: ControlPlane, *, world_size: int = 1,
                 queue: Hashable = None) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        super().__init__()
        self.control = control
        self.world_size = world_size
        self.queue = queue
        # The FC-MAS verbs name a queue only when it is not the node's own: the books
        # may be a node service's, answering the store's verbs (``link.control``).
        self._q: tuple[Hashable, ...] = () if queue is None else (queue,)
        # Loads that run in the next step, with their FC-MAS request (for its order).
        self._step: dict[Hashable, tuple[Tracked[B, K], RestoreRequest]] = {}
        self._released: list[K] = []  # out of the ready queue, for ``take_released``
        self._late: Counter[K] = Counter()

    # -- phases ------------------------------------------------------------------

    def plan(self, req: Tracked[B, K], task: LoadTask, plan: LoadPlan, *,
             in_step: bool) -> None:
        """Its load is planned: it runs in the next step (``in_step``) or waits in
        FC-MAS, queued now."""
        self.move(req, Event.PLAN)
        req.task, req.plan, req.in_step, req.slot = task, plan, in_step, False
        req.reports = []
        if in_step:
            self._step[req.request_id] = (req, self.control.restore_request(
                req.request_id, self.control.clock.now(), plan))
        else:
            self.control.submit_restore(plan, remote_blocks(task), *self._q)

    def submit(self, req: Tracked[B, K], request: RestoreRequest,
               plan: LoadPlan | None = None) -> None:
        """Its load (``plan``; None: nothing to load) is planned and waits in FC-MAS as
        the host weighs it (``request``: its arrival time, its SSD bytes, whether it
        waits for a slot): a host with no ``LoadTask`` (the replay). It starts and is
        released as any load FC-MAS queued."""
        if request.request_id != req.request_id:
            raise ValueError(f"request {req.request_id!r} submitted to FC-MAS as "
                             f"{request.request_id!r}")
        self.move(req, Event.PLAN)
        req.task, req.plan, req.in_step, req.slot = None, plan, False, False
        req.reports = []
        self.fcmas.submit(request)

    @property
    def fcmas(self) -> MasScheduler:
        """The FC-MAS queue the requests wait in (books in this process only)."""
        return self.control.restore_queue(self.queue)

    def take_step(self) -> list[Tracked[B, K]]:
        """The loads of this step, started: in FC-MAS's order (the all-memory ones
        first, then small SSD restores before large ones)."""
        if not self._step:
            return []
        order = self.fcmas.order([rr for _, rr in self._step.values()])
        out = [self._step[rr.request_id][0] for rr in order]
        self._step = {}
        for req in out:
            self.move(req, Event.START)
        return out

    def start_restores(self) -> list[Tracked[B, K]]:
        """The SSD restores FC-MAS starts now, each holding a slot until reported."""
        out = [self._reqs[rr.request_id] for rr in self.control.next_restores(*self._q)]
        for req in out:
            self.move(req, Event.START)
            req.slot = True
        return out

    def gather(self, done: LoadDone) -> Tracked[B, K] | None:
        """One worker's report of a load; the request once all ``world_size`` came."""
        req = self._reqs.get(done.request_id)
        if req is None or req.phase is not Phase.STARTED:
            raise IllegalTransition(done.request_id,
                                    Phase.FINISHED if req is None else req.phase,
                                    Event.REPORT)
        req.reports.append(done)
        return req if len(req.reports) == self.world_size else None

    def reported(self, req: Tracked[B, K]) -> None:
        """Every worker reported its load: a slot holder gives its slot back and waits
        in the ready queue; any other is released."""
        self.move(req, Event.REPORT)
        if req.slot:
            self.control.restore_done(req.request_id, *self._q)
        else:
            self.move(req, Event.RELEASE)

    def pop_ready(self) -> list[Tracked[B, K]]:
        """The requests FC-MAS's ready queue lets go now, in its order: reported ones
        released, queued ones (all in memory) started."""
        out = []
        while (req := self.pop_next()) is not None:
            out.append(req)
        return out

    def pop_next(self) -> Tracked[B, K] | None:
        """The one request FC-MAS's ready queue lets go now (``pop_ready``), or None."""
        rr = self.control.pop_ready_restore(*self._q)
        if rr is None:
            return None
        req = self._reqs[rr.request_id]
        self.move(req, Event.RELEASE if req.phase is Phase.REPORTED else Event.START)
        return req

    def release_ready(self) -> None:
        """``pop_ready``, the released kept for ``take_released``."""
        self._released += [r.request_id for r in self.pop_ready()
                           if r.phase is not Phase.STARTED]

    def take_released(self, reported: Iterable[K]) -> list[K]:
        """The requests released since the last call, in the ready queue's order, then
        those of ``reported`` not waiting in it (a restore reported elsewhere)."""
        released, self._released = self._released, []
        done = set(released)
        return released + [r for r in reported if r not in done and not (
            (req := self._reqs.get(r)) is not None and req.phase is Phase.REPORTED)]

    def drop(self, request_id: K) -> Tracked[B, K] | None:
        self._step.pop(request_id, None)
        return super().drop(request_id)

    def abandon(self) -> list[Tracked[B, K]]:
        self._step.clear()
        self._released.clear()
        return super().abandon()

    @property
    def num_waiting(self) -> int:
        """Loads queued in FC-MAS, not yet started."""
        return self._count[Phase.QUEUED] - len(self._step)

    # -- late reads ---------------------------------------------------------------

    def count_late(self, request_id: K, n: int) -> None:
        """``n`` more (or, negative, fewer) of the request's given-up reads still run."""
        left = self._late[request_id] + n
        if left:
            self._late[request_id] = left
        else:
            del self._late[request_id]

    def disk_late(self) -> bool:
        """A load given up at its deadline is still reading on some worker."""
        return any(n > 0 for n in self._late.values())
