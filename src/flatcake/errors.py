"""Errors shared by the control plane and the data plane."""

from __future__ import annotations


class CapacityError(RuntimeError):
    """A hard capacity budget (host arena, SSD bytes, SSD address space) cannot fit a
    request, even after reclaim. The message names the budget, the request and the use."""


class IntegrityError(RuntimeError):
    """A stateful component found its own books inconsistent (``check_integrity``)."""


class ClusterUnavailableError(ConnectionError):
    """The cluster index (Redis) cannot be reached when a node joins. The message names
    the URL (without its password) and the client's own error."""
