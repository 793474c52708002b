"""Fencing the writers the node service no longer trusts: an engine or attached store
released while its processes may still write (its lease ended: a GC pause, a SIGSTOPped
container, a slow disk). Its unfinished writes are fenced in the books
(``ControlPlane.fence_store``: never published, their keys no longer in flight, their
ranges held), so a late write lands only in a range no one else was given; each range is
freed once its writer is known done with it:

    the writer's processes are gone        the client's process and its descendants
                                           (an engine's workers), each by pid and start
                                           time (a reused pid is another process)
    every worker reported the write ended  an engine of the same process reattached and
                                           its workers' reports name the store (``reported``)

One place for the attached stores and the engines (``service.server``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from flatcake.control import ControlPlane, StorePlan
from flatcake.plan.tasks import StoreDone

logger = logging.getLogger("flatcake.service")

Process = tuple[int, int | None]  # (pid, start time: ``process_start``)


@dataclass(slots=True)
class Fenced:
    """The fenced writes of one released client, until its processes are gone or its
    workers reported each of them (``reports``: reports awaited per write; 0 where only
    the processes' end frees them, an attached store's)."""

    client_id: str
    processes: tuple[Process, ...]  # the client's, first, then its descendants'
    plans: dict[int, StorePlan]  # by segment id
    reports: int
    seen: dict[int, int] = field(default_factory=dict)  # segment id -> reports so far

    @property
    def pid(self) -> int:
        return self.processes[0][0]

    def gone(self) -> bool:
        return all(process_gone(pid, start) for pid, start in self.processes)


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot, ``/proc/PID/stat``
    field 22), or None where it is unknown (no such process, no procfs)."""
    fields = _stat(pid)
    return None if fields is None or fields[0] == b"Z" else int(fields[19])


def _stat(pid: int) -> list[bytes] | None:
    """``/proc/PID/stat``'s fields after the command name (which may hold ")")."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return stat.rsplit(b")", 1)[1].split()


def process_gone(pid: int, started: int | None) -> bool:
    """Process ``pid`` that started at ``started`` can no longer write: it has exited
    (a zombie writes nothing), or its pid names a process started later (pid reuse)."""
    if started is not None:
        return process_start(pid) != started
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process: there
        return False
    return False


def descendants(pid: int) -> list[Process]:
    """The live descendants of ``pid`` (an engine's worker processes), from ``/proc``;
    never this process (a service a client started writes no range of its)."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if name.isdigit() and (fields := _stat(int(name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(name))
    out: list[Process] = []
    todo = list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        if child == os.getpid():
            continue
        out.append((child, process_start(child)))
        todo.extend(children.get(child, ()))
    return out


def fence(control: ControlPlane, client_id: str, pid: int, started: int | None,
          plans: list[StorePlan], reports: int = 0, seen: dict[int, int] | None = None
          ) -> Fenced | None:
    """The unfinished writes ``plans`` of a released client of process ``pid`` (started
    at ``started``): rolled back at once where the process is gone, else fenced
    (returned, for ``free_fenced`` and ``reported``). ``reports``: worker reports that
    end each write (an engine's world size; 0 for none); ``seen``: those already in, by
    segment id."""
    if not plans:
        return None
    if pid <= 0 or process_gone(pid, started):
        for plan in plans:
            control.complete_store(plan, False)
        return None
    for plan in plans:
        control.fence_store(plan)
    return Fenced(client_id, ((pid, started), *descendants(pid)),
                  {p.segment.segment_id: p for p in plans}, reports, dict(seen or {}))


def free_fenced(fenced: list[Fenced], control: ControlPlane) -> list[Fenced]:
    """Free the ranges of every fenced client whose processes are gone; the others."""
    kept = []
    for f in fenced:
        if not f.gone():
            kept.append(f)
            continue
        for plan in f.plans.values():
            control.complete_store(plan, False)
        logger.warning("%s (pid %d) is gone: the ranges of its %d unfinished writes "
                       "freed", f.client_id, f.pid, len(f.plans))
    return kept


def reported(fenced: list[Fenced], control: ControlPlane, pid: int,
             stores: tuple[StoreDone, ...]) -> tuple[StoreDone, ...]:
    """Workers of process ``pid`` reported ``stores``: a fenced write of that process
    every worker reported ended is freed (never published); the reports of the others."""
    mine = [f for f in fenced if f.reports and f.pid == pid]
    if not mine:
        return stores
    left = []
    for done in stores:
        seg_id = done.segment_id
        f = next((f for f in mine if seg_id in f.plans), None)
        if f is None:
            left.append(done)
            continue
        f.seen[seg_id] = f.seen.get(seg_id, 0) + 1
        if f.seen[seg_id] >= f.reports:
            control.complete_store(f.plans.pop(seg_id), False)
            del f.seen[seg_id]
            logger.info("%s's fenced write of segment %d ended: its range freed",
                        f.client_id, seg_id)
    fenced[:] = [f for f in fenced if f.plans]
    return tuple(left)
