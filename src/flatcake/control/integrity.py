"""The control plane's cross-check: every part checks itself, then the parts' books
are checked against each other (pins, per-session bytes, ownership of segments and
memory copies, budgets, loads in flight). Raises ``IntegrityError``; tests and
``flatcake fsck`` call it.
"""

from __future__ import annotations

from collections import Counter

from flatcake.control.address import Medium
from flatcake.control.books import _Books
from flatcake.errors import IntegrityError


class _Integrity(_Books):
    """``check_integrity`` for ``ControlPlane``."""

    def check_integrity(self) -> None:
        """Check every component and that their books agree with each other."""
        self.index.check_integrity()
        self.arena.check_integrity()
        self.ssd.check_integrity()
        self.scheduler.check_integrity()
        self.copies.check_integrity(self.index)
        pins: Counter[str] = Counter()
        for p in self._pending_stores.values():
            pins[p.session_id] += 1
        for lp in self._loads.values():
            for sid in lp.session_ids:
                pins[sid] += 1
        reads: Counter[int] = Counter(run.segment.segment_id for lp in self._loads.values()
                                      for run in lp.hit.runs
                                      if run.segment.medium is Medium.MEMORY)
        if reads != self._copy_reads:
            raise IntegrityError("memory segments read by loads in flight out of sync")
        owned: set[int] = set()
        mem_total = ssd_total = 0
        hdr = self.ssd.file_header_bytes
        for sid, rec in self._sessions.items():
            if rec.num_pins != pins[sid]:
                raise IntegrityError(f"session {sid!r} has {rec.num_pins} pins, books say "
                                     f"{pins[sid]}")
            mem = ssd = 0
            for medium in (Medium.MEMORY, Medium.SSD):
                for seg_id in rec.segment_ids_on(medium):
                    seg = self.index.segment(seg_id)
                    if seg.session_id != sid or seg.medium != medium:
                        raise IntegrityError(f"segment {seg_id} misfiled under {sid!r}")
                    owned.add(seg_id)
                    if medium == Medium.MEMORY:
                        mem += seg.total_bytes
                    else:
                        ssd += seg.total_bytes
            copy = 0
            for seg_id in rec.copy_ids:
                c = self.copies.get(seg_id)
                if c is None or seg_id not in rec.ssd_segment_ids or c.session_id != sid:
                    raise IntegrityError(f"session {sid!r} lists a memory copy of segment "
                                         f"{seg_id} it does not hold")
                copy += c.total_bytes
            for p in self._pending_stores.values():
                if p.session_id == sid:
                    if p.medium == Medium.MEMORY:
                        mem += p.segment.total_bytes
                    else:
                        ssd += p.segment.total_bytes
                    if p.copy is not None:
                        copy += p.copy.total_bytes
            for lp in self._loads.values():
                copy += sum(c.total_bytes for h, c in lp.refills if h.session_id == sid)
            ssd += hdr * len(self.ssd.files_of(sid))
            if (mem, ssd, copy) != (rec.memory_bytes, rec.ssd_bytes, rec.copy_bytes):
                raise IntegrityError(f"session {sid!r} bytes ({rec.memory_bytes}, "
                                     f"{rec.ssd_bytes}, {rec.copy_bytes}) != segments "
                                     f"({mem}, {ssd}, {copy})")
            mem_total += mem + copy
            ssd_total += ssd
        if owned != {s.segment_id for s in self.index.segments()}:
            raise IntegrityError("index holds segments no session owns")
        if sum(len(r.copy_ids) for r in self._sessions.values()) != len(self.copies) or \
                self._copy_holders != {sid for sid, r in self._sessions.items() if r.copy_ids}:
            raise IntegrityError("memory copies no session owns")
        if mem_total != self.arena.used_bytes or ssd_total != self.ssd.used_bytes:
            raise IntegrityError(f"budgets ({self.arena.used_bytes}, {self.ssd.used_bytes}) "
                                 f"!= session books ({mem_total}, {ssd_total})")
        for lp in self._loads.values():
            for run in lp.hit.runs:
                if not self._live_segment_ids(run.segment):
                    raise IntegrityError(f"load {lp.request_id!r} reads dead segment "
                                         f"{run.segment.segment_id}")
        ssd_live = {i for r in self._sessions.values() for i in r.ssd_segment_ids}
        if not self._damaged <= ssd_live:
            raise IntegrityError(f"damaged segments {sorted(self._damaged - ssd_live)} are "
                                 f"not live SSD segments")
        for sid, seg_id in self._cut_at.items():
            owner = self._sessions.get(sid)
            mine = self._damaged & set(owner.ssd_segment_ids) if owner is not None else set()
            on_disk = {i: (self.index.segment(i).file_id, self.index.segment(i).file_offset)
                       for i in mine}
            if seg_id not in mine or on_disk[seg_id] != min(on_disk.values()):
                raise IntegrityError(f"session {sid!r} waits for a cut at segment {seg_id}, "
                                     f"not its earliest damaged segment")
        if self.arena.used_bytes > self.arena.capacity_bytes:
            raise IntegrityError("host arena over budget")
