"""Transparent huge pages for the host buffers FlatCake owns (no torch import).

``direct.aligned_buffer`` maps every unpinned buffer of at least ``HUGE_PAGE`` bytes
2 MiB-aligned and advises ``MADV_HUGEPAGE``; this module says what the kernel makes of
that, for ``inspect`` and the bench report. A direct read into a huge-page buffer goes
to the device as a few large requests (the kernel splits a request at physical page
boundaries it cannot merge), into a 4 KiB-page buffer as many smaller ones.
"""

from __future__ import annotations

import mmap

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
