"""Typed configuration: one frozen dataclass per stage, composed into ``FlatCakeConfig``.

Sources are merged in one place, later ones winning:

1. the defaults of the sections' fields (each documented by the string under it; the docs site's
   configuration page is generated from them, ``flatcake.config_reference``);
2. a TOML file (``[placement]``, ``[reclaim]``, ``[store]``, ``[planner]``,
   ``[scheduler]``, ``[engine]``);
3. environment variables ``FLATCAKE_<SECTION>__<FIELD>`` (e.g. ``FLATCAKE_STORE__NODE_ID=3``);
4. explicit overrides ``"section.field=value"`` (the CLI's ``--set``), or an engine's
   extra config (``load_extra_config``: vLLM's ``kv_connector_extra_config``, SGLang's
   ``--hicache-storage-backend-extra-config``).

Every value goes through ``apply_setting`` (a string is read as the field's type) and every
field is validated in ``__post_init__``: a bad key or value raises one ``ValueError``
naming the key and the value, an unknown key names the closest known one.

The package: the units and checks (``checks``), the sections (``stages``: placement,
reclaim, planner, scheduler; ``store``; ``engine``), ``FlatCakeConfig`` and its keys
(``schema``), and the reading of the sources (``parse``).
"""

from __future__ import annotations

from flatcake.config.checks import GIB, KIB, MIB, TIB
from flatcake.config.engine import EngineConfig
from flatcake.config.parse import Setting, apply_setting, load_config, load_extra_config
from flatcake.config.schema import SECTIONS, FlatCakeConfig, keys
from flatcake.config.stages import PlacementConfig, PlannerConfig, ReclaimConfig, SchedulerConfig
from flatcake.config.store import THREAD_CPUS_WORDS, WINDOW_ROWS, StoreConfig, parse_cpu_list

__all__ = ["GIB", "KIB", "MIB", "SECTIONS", "THREAD_CPUS_WORDS", "TIB", "WINDOW_ROWS",
           "EngineConfig", "FlatCakeConfig", "PlacementConfig", "PlannerConfig",
           "ReclaimConfig", "SchedulerConfig", "Setting", "StoreConfig", "apply_setting",
           "keys", "load_config", "load_extra_config", "parse_cpu_list"]
