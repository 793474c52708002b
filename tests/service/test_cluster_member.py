"""The node service in a cluster, without Redis or NIXL: which engine configurations it
refuses, by name (tests/cluster/test_service_cluster.py runs the real thing)."""

from __future__ import annotations

import pytest

from flatcake.config import FlatCakeConfig, load_config
from flatcake.link.wire import NodeRefused
from flatcake.service.cluster import same_cluster

URL = "redis://10.0.0.5:6379/0"


def cfg(*overrides: str) -> FlatCakeConfig:
    return load_config(env={}, overrides=list(overrides))


def test_store_node_with_cluster_url_is_a_valid_configuration() -> None:
    config = cfg("store.node=unix:/tmp/x.sock", f"store.cluster_url={URL}")
    assert config.store.node and config.store.cluster_url == URL


def test_an_engine_naming_the_service_s_cluster_or_none_attaches() -> None:
    service = cfg(f"store.cluster_url={URL}", "store.node_id=3")
    same_cluster(cfg(), service)
    same_cluster(cfg(f"store.cluster_url={URL}", "store.node_id=3"), service)


@pytest.mark.parametrize("engine, service, named", [
    ([f"store.cluster_url={URL}", "store.node_id=4"], [f"store.cluster_url={URL}",
                                                       "store.node_id=3"], "node 3 of"),
    ([f"store.cluster_url={URL}", "store.cluster_name=b"], [f"store.cluster_url={URL}"],
     "node 0 of cluster 'flatcake'"),
    ([f"store.cluster_url={URL}"], [], "in no cluster"),
])
def test_an_engine_naming_another_cluster_is_refused_by_name(
        engine: list[str], service: list[str], named: str) -> None:
    with pytest.raises(NodeRefused, match=f"this node service is {named}"):
        same_cluster(cfg(*engine), cfg(*service))
