"""Moved to ``flatcake.control.signals`` (one derivation for every host); re-exported."""

from flatcake.control.signals import HitOwner, PrefixRefcount, SessionTracker, TurnInfo

__all__ = ["HitOwner", "PrefixRefcount", "SessionTracker", "TurnInfo"]
