"""An engine attached to the node service runs with the service's store and policies
and its own ``[engine]`` section: two engines on one service, one asking for longer
hits (``engine.min_hit_blocks``), see the same stored turn differently."""

from __future__ import annotations

from pathlib import Path

from flatcake.connectors.scheduler_side import RequestView
from flatcake.control.keys import chain_block_keys
from tests.connectors.sides_harness import G, end
from tests.service.helpers import Engine, Service


def request(rid: str, toks: list[int], computed: int = 0) -> RequestView:
    keys = tuple(chain_block_keys(toks, G.tokens_per_block, "tiny", ""))
    return RequestView(rid, keys, len(toks), len(toks), 3, computed, "chat")


def test_each_attached_engine_reads_its_own_engine_section(tmp_path: Path) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock").start()
    a = Engine(svc.sock, seed=1, name="A")
    b = Engine(svc.sock, seed=2, name="B", overrides=("engine.min_hit_blocks=4",))
    try:
        toks = list(range(100, 113))  # 3 full blocks + 1 token
        v = request("a0", toks, computed=len(toks))
        assert a.sched.num_matched_tokens(v, 0) == (0, False)
        _, params = end(a, v, [5, 6, 7, 8])
        a.step()
        assert params["flatcake"]["stored_blocks"] == 3
        nxt = toks + list(range(200, 208))
        # The same 3 stored blocks: a hit for A, shorter than B's min_hit_blocks.
        assert a.sched.num_matched_tokens(request("a1", nxt), 0) == (12, True)
        assert b.sched.num_matched_tokens(request("b1", nxt), 0) == (0, False)
    finally:
        a.close()
        b.close()
        assert svc.stop() == 0, svc.stderr()
