"""The ``[engine]`` section: what an engine host does around the store."""

from __future__ import annotations

from dataclasses import dataclass

from flatcake.config.checks import check, check_types


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What an engine host (the vLLM connector, the SGLang backend, an engine the node
    service hosts) does around the store. Every host reads these keys from this one
    section; in an engine's extra config they may also be given bare (``"tenant_salt"``
    for ``"engine.tenant_salt"``), the names they had before they were a section."""

    tenant_salt: str = ""
    """Mixed into every block key's namespace (with the model name), so two deployments
    sharing a store root never read each other's blocks."""
    model_name: str = ""
    """(SGLang) The model name in the key namespace where SGLang passes none."""
    infer_sessions: bool = True
    """A request that carries no ``session_id`` is attributed to the session whose stored
    history it extends (``control.signals.SessionTracker``); false makes each such request
    a session of its own."""
    max_sessions: int = 100_000
    """Sessions a host's session tracker remembers; the least recently used one past it is
    forgotten (its next turn starts a new session)."""
    min_hit_blocks: int = 1
    """Hits shorter than this many blocks are recomputed instead of loaded (a restore has
    a fixed cost)."""
    max_pending_stores: int = 64
    """Turn writes a worker queues behind the one it is writing; a store beyond them is
    dropped (a later miss), never waited for."""
    shutdown_drain_s: float = 60.0
    """How long a stopping worker waits for queued writes; what is left is dropped, never
    published. A worker that its engine kills after a grace period drains for at most half
    of it."""
    ssd_loads_in_step: bool = True
    """On a CPU engine, an SSD hit loads in the step that schedules its request, the
    forward pass waiting for each layer; false keeps it async: the request waits in vLLM's
    remote-KV state and other requests' steps never wait for a disk."""
    in_step_load_timeout_s: float = 5.0
    """How long a step waits for a load in the step (an in-step SSD hit, or an all-memory
    one), from the step's start. Past it the load is given up: its blocks are load errors
    that the engine recomputes, and the restore is fenced off from the KV slots."""
    async_load_timeout_s: float = 60.0
    """How long an async load (an SSD hit on a GPU engine, a hit on other nodes) may take
    from its start, queueing for a staging window included; past it the load is given up
    as an in-step one is."""
    cluster_lookup_timeout_s: float = 2.0
    """(cluster) Bound of one Redis call of the scheduler half's index lookups (at most
    ``store.remote_timeout_s``)."""
    cluster_lookup_retry_s: float = 5.0
    """(cluster) After a failed index lookup, lookups answer local-only this long without
    asking Redis."""
    cluster_lookup_fresh_s: float = 1.0
    """(cluster) A request's remote runs are looked up again after this long (the engine
    asks every step a request waits)."""
    cluster_lookup_first_keys: int = 8
    """(cluster) Keys of a request's first index lookup; each next one asks four times
    more while every key asked was found, so a miss costs one small lookup."""
    node_reattach_s: float = 1.0
    """(attached) The first wait before re-attaching to a node service that stopped
    answering; it doubles at each failed attempt."""
    node_reattach_max_s: float = 30.0
    """(attached) The longest wait between two re-attach attempts."""

    def __post_init__(self) -> None:
        check_types(self, "engine")
        for name in ("min_hit_blocks", "max_pending_stores", "max_sessions",
                     "cluster_lookup_first_keys"):
            check(getattr(self, name) >= 1, f"engine.{name}", getattr(self, name),
                   "must be >= 1")
        check(self.shutdown_drain_s >= 0, "engine.shutdown_drain_s", self.shutdown_drain_s,
               "must be >= 0")
        for name in ("in_step_load_timeout_s", "async_load_timeout_s",
                     "cluster_lookup_timeout_s", "cluster_lookup_retry_s",
                     "cluster_lookup_fresh_s", "node_reattach_s"):
            check(getattr(self, name) > 0, f"engine.{name}", getattr(self, name),
                   "must be > 0")
        check(self.node_reattach_max_s >= self.node_reattach_s, "engine.node_reattach_max_s",
               self.node_reattach_max_s, "must be >= engine.node_reattach_s")

    def drain_within(self, grace_s: float | None) -> float:
        """How long a stopping worker drains its writes when its engine gives the
        process ``grace_s`` seconds to exit before it signals it (``None``: no limit):
        ``shutdown_drain_s``, but at most half of the grace. The process must still exit
        after the drain (vLLM's worker collects its whole heap, about 2 CPU s on a
        CPU machine), and a drain cut short by a kill would leave a write half done
        for the next start to discard instead of dropping it cleanly."""
        if grace_s is None:
            return self.shutdown_drain_s
        return min(self.shutdown_drain_s, max(grace_s, 0.0) / 2)


