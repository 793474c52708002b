"""A vLLM KV connector that does nothing: what vLLM's connector hooks cost on their own.

``scripts/loadgen_compare.py --configs none,null-connector,flatcake`` runs it as a third
server: vLLM with ``--kv-transfer-config`` naming this class, so the engine takes every
path it takes for a connector (the scheduler's per-request lookup, the step's
metadata, the worker's per-layer load and save hooks, the finished-request hand-off)
while the connector matches nothing, loads nothing and stores nothing. A gap between
``none`` and ``null-connector`` is the engine's; between ``null-connector`` and
``flatcake``, FlatCake's own. A measuring tool, outside the package: the comparison puts
this folder on that server's ``PYTHONPATH``; only vLLM imports it.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
)


class NullConnector(KVConnectorBase_V1):
    """Every hook answers at once: no match, no load, no store, nothing held."""

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None
