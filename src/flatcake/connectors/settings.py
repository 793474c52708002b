"""The vLLM connector's configuration: ``kv_connector_extra_config`` -> ``FlatCakeConfig``.

The extra config takes the configuration's own keys (``docs/usage/configuration.md``),
read by the one parser every source goes through (``config.load_extra_config``): a
section is a nested object or dotted keys, the ``[engine]`` keys may be given bare, and
a TOML file may be named too::

    {"store": {"root": "/nvme/flatcake", "memory_capacity_bytes": 8589934592},
     "placement.short_reply_threshold_tokens": 256,
     "config_file": "/etc/flatcake.toml",
     "tenant_salt": "team-a", "infer_sessions": true}

Sources merge as in ``config.load_config``: defaults, then ``config_file``, then
``FLATCAKE_<SECTION>__<FIELD>`` environment variables, then the extra config itself.
The geometry never comes from configuration: the connector reads it off the engine's
KV cache, so ``model`` is refused. Any other unknown key is a ``ValueError`` naming it.
With ``store.cluster_url`` set the worker half joins the cluster as ``store.node_id``
(serves its arena and files, publishes what it writes; it needs NIXL and the ``redis``
client) and the scheduler half counts the blocks other nodes hold after its own
(``connectors.cluster_side``). Tensor parallelism above 1 is refused in a cluster
(``connectors.vllm``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flatcake.config import FlatCakeConfig, load_extra_config

# The line the scheduler half logs at start: whether SSD hits load in the step, and why
# (``report.engine_log`` reads it back from a server's log).
IN_STEP_LINE = "FlatCake ssd_loads_in_step effective: %s (%s)"


def parse_extra_config(extra: Mapping[str, Any] | None,
                       env: Mapping[str, str] | None = None) -> FlatCakeConfig:
    """Validate ``kv_connector_extra_config`` and build the configuration.

    ``env`` defaults to ``os.environ`` (``FLATCAKE_*`` variables); bad values raise
    ``ValueError`` naming the key and the value.
    """
    return load_extra_config("kv_connector_extra_config", extra, env)
