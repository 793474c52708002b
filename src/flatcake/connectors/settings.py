"""Connector settings: ``kv_connector_extra_config`` -> a validated ``ConnectorSettings``.

The store's own configuration keeps its names (``flatcake.config``): a section is a
nested object or dotted keys, and a TOML file may be named too::

    {"store": {"root": "/nvme/flatcake", "memory_capacity_bytes": 8589934592},
     "placement.short_reply_threshold_tokens": 256,
     "config_file": "/etc/flatcake.toml",
     "tenant_salt": "team-a", "infer_sessions": true}

Sources merge as in ``config.load_config``: defaults, then ``config_file``, then
``FLATCAKE_<SECTION>__<FIELD>`` environment variables, then the extra config itself.
The geometry never comes from configuration: the connector reads it off the engine's
KV cache, so ``model`` is refused. Any other unknown key is a ``ValueError`` naming it.
The cluster settings are the store's too: ``store.node_id`` (unique per node),
``store.cluster_url`` (Redis; empty = this node alone), ``store.cluster_name``,
``store.remote_timeout_s`` and ``store.remote_window_bytes``. With ``cluster_url`` set
the worker half joins the cluster as ``node_id`` (serves its arena and files, publishes
what it writes; it needs NIXL and the ``redis`` client) and the scheduler half counts
the blocks other nodes hold after its own (``connectors.cluster_side``). Tensor
parallelism above 1 is refused in a cluster (``connectors.vllm``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flatcake.config import SECTIONS, FlatCakeConfig, load_config, section_overrides


@dataclass(frozen=True, slots=True)
class ConnectorSettings:
    """Everything the vLLM connector is configured with.

    Attributes:
        config: the store's configuration (placement, reclaim, planner, scheduler, store).
        tenant_salt: mixed into every block key's namespace (with the model name), so
            two deployments sharing a store root never read each other's blocks.
        infer_sessions: when a request carries no ``session_id``, attribute it to the
            session whose stored history it extends (``sessions.SessionTracker``);
            ``False`` makes each such request a session of its own.
        min_hit_blocks: hits shorter than this many blocks are recomputed instead of
            loaded (a restore has a fixed cost).
        max_pending_stores: turn writes a worker queues behind the one it is writing;
            a store beyond them is dropped (a later miss), never waited for.
        shutdown_drain_s: how long a stopping worker waits for queued writes; what is
            left is dropped, never published. A worker process that its engine kills
            after a grace period drains for at most half of it (``drain_within``).
        ssd_loads_in_step: on a CPU engine, an SSD hit loads in the step that schedules
            its request, the forward pass waiting for each layer
            (``SchedulerSide.ssd_in_step``); ``False`` keeps it async: the request waits
            in vLLM's remote-KV state and other requests' steps never wait for a disk.
        in_step_load_timeout_s: how long a step waits for a load in the step (an
            in-step SSD hit, or an all-memory one), from the step's start. Past it the
            load is given up: its blocks are load errors that the engine recomputes,
            and the restore is fenced off from the KV slots. The default 5 s is the
            bound ``store.remote_timeout_s`` puts on a remote read.
        async_load_timeout_s: how long an async load (an SSD hit on a GPU engine, a
            hit on other nodes) may take from its start, queueing for a staging window
            included. Past it the load is given up as an in-step one is: its blocks
            are load errors, its request is recomputed instead of waiting for a hung
            disk, and the restore is fenced off from the KV slots.
    """

    config: FlatCakeConfig = field(default_factory=FlatCakeConfig)
    tenant_salt: str = ""
    infer_sessions: bool = True
    min_hit_blocks: int = 1
    max_pending_stores: int = 64
    shutdown_drain_s: float = 60.0
    ssd_loads_in_step: bool = True
    in_step_load_timeout_s: float = 5.0
    async_load_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        _want(isinstance(self.tenant_salt, str), "tenant_salt", self.tenant_salt, "a string")
        for name in ("infer_sessions", "ssd_loads_in_step"):
            _want(isinstance(getattr(self, name), bool), name, getattr(self, name),
                  "a boolean")
        for name in ("min_hit_blocks", "max_pending_stores"):
            n = getattr(self, name)
            _want(_is_int(n) and n >= 1, name, n, "an int >= 1")
        d = self.shutdown_drain_s
        _want(_is_number(d) and 0 <= d < math.inf, "shutdown_drain_s", d,
              "a finite number >= 0")
        for name in ("in_step_load_timeout_s", "async_load_timeout_s"):
            t = getattr(self, name)
            _want(_is_number(t) and 0 < t < math.inf, name, t, "a finite number > 0")

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


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _want(ok: bool, name: str, value: object, what: str) -> None:
    """The one shape of a bad setting's error: the key, what it must be, the value."""
    if not ok:
        raise ValueError(f"kv_connector_extra_config.{name} must be {what}, got {value!r}")


# The line the scheduler half logs at start: whether SSD hits load in the step, and why
# (``report.engine_log`` reads it back from a server's log).
IN_STEP_LINE = "FlatCake ssd_loads_in_step effective: %s (%s)"


_CONNECTOR_KEYS = ("config_file", "tenant_salt", "infer_sessions", "min_hit_blocks",
                   "max_pending_stores", "shutdown_drain_s", "ssd_loads_in_step",
                   "in_step_load_timeout_s", "async_load_timeout_s")


def parse_extra_config(extra: Mapping[str, Any] | None,
                       env: Mapping[str, str] | None = None) -> ConnectorSettings:
    """Validate ``kv_connector_extra_config`` and build the settings.

    ``env`` defaults to ``os.environ`` (``FLATCAKE_*`` variables); bad values raise
    ``ValueError`` naming the key and the value.
    """
    extra = {} if extra is None else extra
    if not isinstance(extra, Mapping):
        raise ValueError(f"kv_connector_extra_config must be a JSON object, got "
                         f"{type(extra).__name__}")
    overrides: list[str] = []
    kwargs: dict[str, Any] = {}
    config_file = None
    for key, value in extra.items():
        if not isinstance(key, str):
            raise ValueError(f"kv_connector_extra_config keys must be strings, got {key!r}")
        if key == "config_file":
            _want(isinstance(value, str) and bool(value), key, value, "a path")
            config_file = value
        elif key in _CONNECTOR_KEYS:
            kwargs[key] = value
        elif key == "model":
            raise ValueError("kv_connector_extra_config.model is not accepted: the connector "
                             "takes the KV geometry from the engine's KV cache")
        elif (found := section_overrides("kv_connector_extra_config", key, value)) is not None:
            overrides.extend(found)
        else:
            known = sorted((*_CONNECTOR_KEYS, *SECTIONS))
            raise ValueError(f"unknown kv_connector_extra_config key {key!r}; known keys: "
                             f"{known} (or 'section.field')")
    config = load_config(config_file, env, overrides)
    return ConnectorSettings(config=config, **kwargs)
