"""The control plane's cross-check: every part checks itself, then the parts' books
are checked against each other (pins, per-session bytes, ownership of segments and
memory copies, budgets, loads in flight, damage). Raises ``IntegrityError``; tests and
``flatcake fsck`` call it (``ControlPlane.check_integrity``). It only reads.
"""

from __future__ import annotations

from collections import Counter

from flatcake.control.address import Medium
from flatcake.control.alloc import HostArena
from flatcake.control.copies import MemoryCopies
from flatcake.control.damage import Damage
from flatcake.control.index import BlockIndex
from flatcake.control.loads import Loads
from flatcake.control.scheduler import MasScheduler
from flatcake.control.sessions import SessionTable
from flatcake.control.spare import Spare
from flatcake.control.ssd_space import SsdSpace
from flatcake.control.stores import Stores
from flatcake.control.windows import released_bytes
from flatcake.errors import IntegrityError


def check_books(*, index: BlockIndex, arena: HostArena, ssd: SsdSpace,
                scheduler: MasScheduler, copies: MemoryCopies, sessions: SessionTable,
                stores: Stores, loads: Loads, spare: Spare, damage: Damage) -> None:
    """Check every component and that their books agree with each other."""
    index.check_integrity()
    arena.check_integrity()
    ssd.check_integrity()
    scheduler.check_integrity()
    copies.check_integrity(index)
    pending = stores.pending.values()
    in_flight = loads.loads.values()
    pins: Counter[str] = Counter()
    for p in pending:
        pins[p.session_id] += 1
    for lp in in_flight:
        for sid in lp.session_ids:
            pins[sid] += 1
    reads: Counter[int] = Counter(run.segment.segment_id for lp in in_flight
                                  for run in lp.hit.runs
                                  if run.segment.medium is Medium.MEMORY)
    if reads != spare.reads:
        raise IntegrityError("memory segments read by loads in flight out of sync")
    owned: set[int] = set()
    mem_total = ssd_total = 0
    hdr = ssd.file_header_bytes
    for sid, rec in sessions.items():
        if rec.num_pins != pins[sid]:
            raise IntegrityError(f"session {sid!r} has {rec.num_pins} pins, books say "
                                 f"{pins[sid]}")
        mem = ssd_bytes = 0
        turns: Counter[int] = Counter()
        for medium in (Medium.MEMORY, Medium.SSD):
            for seg_id in rec.segment_ids_on(medium):
                seg = index.segment(seg_id)
                if seg.session_id != sid or seg.medium != medium:
                    raise IntegrityError(f"segment {seg_id} misfiled under {sid!r}")
                owned.add(seg_id)
                turns[seg.turn_index] += 1
                if medium == Medium.MEMORY:
                    mem += seg.total_bytes
                else:  # released window rows are not on disk any more
                    ssd_bytes += seg.total_bytes - released_bytes(seg.layout)
        if turns != rec.turns or rec.newest_turn != max(turns, default=-1):
            raise IntegrityError(f"session {sid!r} keeps turns {rec.turns} (newest "
                                 f"{rec.newest_turn}), its segments hold {dict(turns)}")
        copy = 0
        for seg_id in rec.copy_ids:
            c = copies.get(seg_id)
            if c is None or seg_id not in rec.ssd_segment_ids or c.session_id != sid:
                raise IntegrityError(f"session {sid!r} lists a memory copy of segment "
                                     f"{seg_id} it does not hold")
            copy += c.total_bytes
        for p in pending:
            if p.session_id == sid:
                if p.medium == Medium.MEMORY:
                    mem += p.segment.total_bytes
                else:
                    ssd_bytes += p.segment.total_bytes
                if p.copy is not None:
                    copy += p.copy.total_bytes
        for lp in in_flight:
            copy += sum(c.total_bytes for h, c in lp.refills if h.session_id == sid)
        ssd_bytes += hdr * len(ssd.files_of(sid))
        if (mem, ssd_bytes, copy) != (rec.memory_bytes, rec.ssd_bytes, rec.copy_bytes):
            raise IntegrityError(f"session {sid!r} bytes ({rec.memory_bytes}, "
                                 f"{rec.ssd_bytes}, {rec.copy_bytes}) != segments "
                                 f"({mem}, {ssd_bytes}, {copy})")
        mem_total += mem + copy
        ssd_total += ssd_bytes
    if owned != {s.segment_id for s in index.segments()}:
        raise IntegrityError("index holds segments no session owns")
    if sum(len(r.copy_ids) for r in sessions.values()) != len(copies) or \
            spare.holders != {sid for sid, r in sessions.items() if r.copy_ids}:
        raise IntegrityError("memory copies no session owns")
    if mem_total != arena.used_bytes or ssd_total != ssd.used_bytes:
        raise IntegrityError(f"budgets ({arena.used_bytes}, {ssd.used_bytes}) "
                             f"!= session books ({mem_total}, {ssd_total})")
    for lp in in_flight:
        for run in lp.hit.runs:
            if not loads.is_live(run.segment):
                raise IntegrityError(f"load {lp.request_id!r} reads dead segment "
                                     f"{run.segment.segment_id}")
    damage.check_integrity()
    if arena.used_bytes > arena.capacity_bytes:
        raise IntegrityError("host arena over budget")
