"""The host-memory arena's bytes: one ``uint8`` tensor of ``memory_capacity_bytes``.

The control plane's ``control.alloc.HostArena`` decides offsets; this class only holds the
bytes. Embedded, the tensor comes from ``torch.empty``, so the kernel maps pages on first
touch: a 64 GiB budget costs nothing until blocks are written into it. Attached to a node
service, it maps the service's shared arena file (``path``, under ``/dev/shm`` or a
hugetlbfs mount; created and sized by the service, mode 0600) with ``MAP_SHARED``,
advised ``MADV_HUGEPAGE`` (``cio.hugepages.shared_arena_pages`` says what it gets), so
every engine on the machine reads the blocks any of them wrote, and they outlive the
engine that wrote them. It is not pinned (pinning would touch and lock every page up
front); host-to-GPU copies out of it go through the engine's stream like any pageable
copy.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path

import torch


class ArenaBuffer:
    """Bytes of the host arena. Writers and readers touch disjoint ranges that the
    control plane handed out, so the buffer itself needs no lock."""

    def __init__(self, capacity_bytes: int, path: Path | None = None) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"store.memory_capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.path = path
        if path is None:
            self.tensor = torch.empty(capacity_bytes, dtype=torch.uint8)
            return
        try:
            size = os.stat(path).st_size
        except OSError as exc:
            raise ValueError(f"cannot map the node service's arena {path}: {exc}") from None
        if size < capacity_bytes:
            raise ValueError(f"the node service's arena {path} has {size} bytes, this "
                             f"engine's store.memory_capacity_bytes is {capacity_bytes}")
        self.tensor = self._map(path, size)[:capacity_bytes] if capacity_bytes \
            else torch.empty(0, dtype=torch.uint8)

    def _map(self, path: Path, size: int) -> torch.Tensor:
        """The whole file, ``MAP_SHARED``, advised ``MADV_HUGEPAGE`` (huge pages where
        its tmpfs mount allows them; a hugetlbfs file is huge pages anyway)."""
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            self._mmap = mmap.mmap(fd, size, mmap.MAP_SHARED)
        finally:
            os.close(fd)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            with contextlib.suppress(OSError):
                self._mmap.madvise(mmap.MADV_HUGEPAGE)
        return torch.frombuffer(self._mmap, dtype=torch.uint8)

    def view(self, offset: int, length: int) -> torch.Tensor:
        """Bytes ``[offset, offset + length)`` (a view, no copy)."""
        if offset < 0 or length < 0 or offset + length > self.capacity_bytes:
            raise ValueError(f"arena range [{offset}, {offset + length}) is outside "
                             f"[0, {self.capacity_bytes})")
        return self.tensor[offset:offset + length]
