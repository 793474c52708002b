"""Huge pages for the host buffers FlatCake owns (no torch import).

``direct.aligned_buffer`` maps every unpinned buffer of at least ``HUGE_PAGE`` bytes
2 MiB-aligned and advises ``MADV_HUGEPAGE``; this module says what the kernel makes of
that, for ``inspect`` and the bench report. A direct read into a huge-page buffer goes
to the device as a few large requests (the kernel splits a request at physical page
boundaries it cannot merge), into a 4 KiB-page buffer as many smaller ones.

The node service's shared arena is a file every attached process maps: its pages are
huge where its directory's mount gives them (``shared_arena_pages``): a hugetlbfs mount
(explicit huge pages, reserved up front), or a tmpfs mounted with ``huge=`` (or the
kernel's shmem THP ``force``), whose mappings are advised ``MADV_HUGEPAGE``.
"""

from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass

HUGE_PAGE = 2 << 20  # x86-64 / arm64 (4 KiB base pages) transparent huge page size
_THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_page_mode() -> str:
    """The kernel's transparent huge page mode: ``"always"``, ``"madvise"`` (only for
    ranges advised with ``MADV_HUGEPAGE``, which ``aligned_buffer`` does), ``"never"``,
    or ``"unavailable"`` (no THP support, or not Linux)."""
    try:
        with open(_THP_ENABLED, encoding="ascii") as f:
            text = f.read()
    except OSError:
        return "unavailable"
    chosen = [w[1:-1] for w in text.split() if w.startswith("[") and w.endswith("]")]
    return chosen[0] if chosen else "unavailable"


def huge_pages_note() -> str:
    """One line for ``inspect`` and the bench report: how FlatCake's host buffers are
    backed on this machine."""
    mode = huge_page_mode()
    backed = ("transparent huge pages" if mode in ("always", "madvise") and
              hasattr(mmap, "MADV_HUGEPAGE") else "4 KiB pages")
    return (f"host buffers >= {HUGE_PAGE >> 20} MiB: 2 MiB-aligned, {backed} "
            f"(kernel THP mode: {mode}; pinned CUDA buffers excepted)")


# -- the node service's shared arena file -----------------------------------------------

_SHMEM_ENABLED = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"
_MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True, slots=True)
class ArenaPages:
    """How the pages of a shared arena file in some directory are backed.

    Attributes:
        huge: 2 MiB (or larger) pages.
        explicit: hugetlbfs: the file is sized in whole huge pages and reserved up front
            (a page the pool cannot give would otherwise kill the process touching it).
        note: one line for the log and ``flatcake serve --status``.
    """

    huge: bool
    explicit: bool
    note: str


def arena_pages(fs_type: str, mount_options: str, shmem_mode: str) -> ArenaPages:
    """The backing of a file on a ``fs_type`` mount with ``mount_options`` (its super
    options), the kernel's shmem THP mode being ``shmem_mode`` (pure)."""
    if fs_type == "hugetlbfs":
        return ArenaPages(True, True, "explicit huge pages (hugetlbfs)")
    if fs_type != "tmpfs":
        return ArenaPages(False, False, f"4 KiB pages ({fs_type or 'unknown'} is not "
                                        "tmpfs or hugetlbfs)")
    huge = next((o.split("=", 1)[1] for o in mount_options.split(",")
                 if o.startswith("huge=")), "never")
    if shmem_mode == "force" or (shmem_mode != "deny" and huge in ("always", "within_size",
                                                                   "advise")):
        how = "forced" if shmem_mode == "force" else f"huge={huge}"
        return ArenaPages(True, False, f"transparent huge pages (tmpfs, {how}; mappings "
                                       "advised)")
    return ArenaPages(False, False, f"4 KiB pages (tmpfs huge={huge}, shmem THP "
                                    f"{shmem_mode}: mount a hugetlbfs or a tmpfs with "
                                    "huge=within_size and point store.node_arena_dir at it "
                                    "for huge pages)")


def _chosen(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            words = f.read().split()
    except OSError:
        return "unavailable"
    return next((w[1:-1] for w in words if w.startswith("[") and w.endswith("]")),
                "unavailable")


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_of(directory: str) -> tuple[str, str]:
    """(file system type, super options) of the mount holding ``directory``, from
    ``/proc/self/mountinfo`` (("", "") when unreadable)."""
    real = os.path.realpath(directory)
    best, found = -1, ("", "")
    try:
        with open(_MOUNTINFO, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return found
    for line in lines:
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(rest) < 3:
            continue
        point = _unescape(fields[4])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:  # the last of equal mounts is the visible one
            best, found = len(point), (rest[0], rest[2])
    return found


def shared_arena_pages(directory: str) -> ArenaPages:
    """How a shared arena file made in ``directory`` is backed on this machine."""
    fs_type, options = mount_of(directory)
    return arena_pages(fs_type, options, _chosen(_SHMEM_ENABLED))
