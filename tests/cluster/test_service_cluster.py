"""Node services as their nodes' members of the cluster index: two ``flatcake serve``
on two roots (nodes 1 and 2, real Redis, NIXL on 127.0.0.1), an engine attached to each
(the connector's two halves without vLLM, one worker per tensor-parallel rank). A
session written through node 1's service is restored by the engine attached to node
2, byte for byte, every rank its own part (heads split) or the one replicated part
(MLA), 3 blocks from node 1's SSD and 2 from its shared arena. Node 1's service killed:
node 2's engine misses cleanly (no hit, or load errors with its slots untouched).

Needs torch, NIXL (``helpers.store_env``) and redis-server; skips without them."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flatcake.store import FlatCakeStore
from tests.cluster.helpers import ask, child_env, next_line, process
from tests.connectors.sides_harness import G
from tests.service.helpers import Service
from tests.store.helpers import SMALL, small_config

PEER = Path(__file__).with_name("service_peer.py")


@pytest.fixture
def nodes(env: dict[str, str], redis_url: str, cluster: str, tmp_path: Path
          ) -> Iterator[tuple[Service, Service]]:
    common = [f"store.cluster_url={redis_url}", f"store.cluster_name={cluster}",
              "store.remote_timeout_s=3", "store.remote_window_bytes=1048576"]
    run = tmp_path / "run"
    a = Service(tmp_path / "a", run / "a.sock", *common, "store.node_id=1",
                env=child_env(env))
    b = Service(tmp_path / "b", run / "b.sock", *common, "store.node_id=2",
                env=child_env(env))
    a.start()
    try:
        b.start()
        try:
            yield a, b
        finally:
            assert b.stop() == 0, b.stderr()
    finally:
        a.stop()


@pytest.mark.parametrize("layout", ["tp1", "split", "mla"])
def test_a_session_written_through_node_1_is_restored_through_node_2(
        nodes: tuple[Service, Service], env: dict[str, str], layout: str) -> None:
    a, b = nodes
    with process([sys.executable, "-u", str(PEER), layout, str(a.sock), str(b.sock)],
                 env) as peer:
        got = json.loads(next_line(peer, 240))
        ranks = 1 if layout == "tp1" else 2
        assert got["matched"] == 5, got  # 3 SSD blocks + 2 memory blocks of node 1
        assert len(got["recving"]) == 1
        assert got["invalid"] == [] and got["exact"] and got["untouched"], got
        # Every rank read its 5 blocks from node 1 (whole segment layers).
        assert got["remote_bytes"] == [5 * G.num_layers * G.layer_block_bytes[0]] * ranks
        assert got["parts_differ"] == (layout == "split")
        a.kill()
        again = ask(peer, "again")
        # Gone: no hit once its lease is over, or load errors before that; never a byte
        # written into the slots.
        assert again["matched"] == 0 or (again["invalid"] == [0, 1, 2, 3, 4]
                                         and again["untouched"]), again


def test_an_attached_store_is_refused_by_name(nodes: tuple[Service, Service]) -> None:
    a, _ = nodes
    cfg = small_config(f"store.node=unix:{a.sock}", "store.node_timeout_s=5")
    with pytest.raises(ValueError, match=r"in a cluster \(store.cluster_url\): an attached "
                       "FlatCakeStore"):
        FlatCakeStore.open(a.root, SMALL, cfg)
