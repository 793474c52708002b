"""``FlatCakeConfig``: the sections composed into one configuration, and the keys a
user may set."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from flatcake.config.engine import EngineConfig
from flatcake.config.stages import PlacementConfig, PlannerConfig, ReclaimConfig, SchedulerConfig
from flatcake.config.store import StoreConfig


@dataclass(frozen=True, slots=True)
class FlatCakeConfig:
    """The whole configuration, one section per stage."""

    model: str = "llama-3.1-8b"
    """The geometry preset (``geometry.PRESETS``) of the store API and the tools; an engine
    host takes its geometry from the engine's KV cache instead."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    reclaim: ReclaimConfig = field(default_factory=ReclaimConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)


SECTIONS: dict[str, type] = {
    "placement": PlacementConfig,
    "reclaim": ReclaimConfig,
    "planner": PlannerConfig,
    "scheduler": SchedulerConfig,
    "store": StoreConfig,
    "engine": EngineConfig,
}
"""Each section of ``FlatCakeConfig`` and its dataclass, in the order the docs list them."""


def keys() -> list[str]:
    """Every key a user may set, as ``section.field`` (``model`` alone)."""
    return ["model", *(f"{section}.{f.name}" for section, cls in SECTIONS.items()
                       for f in dataclasses.fields(cls))]
