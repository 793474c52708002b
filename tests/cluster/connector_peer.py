"""The vLLM connector's two halves as one node of a cluster, for
tests/cluster/test_connector_cluster.py. Runs with torch and NIXL importable; prints one
line per result ("ready" or JSON).

    connector_peer.py owner URL CLUSTER DIR   node 0 (paged KV seed 0) runs session s
                                              (turn 0: 3 blocks on SSD, turn 1: 2 more
                                              in memory) and session t (3 blocks on
                                              SSD), prints "ready", waits
    connector_peer.py asker URL CLUSTER DIR   node 1 (seed 1) runs one command per stdin
                                              line: "lookup NAME LOCAL_BLOCKS" (the
                                              scheduler half's count), "load" (the
                                              looked-up request's load, then its end),
                                              "store" (that request's prompt stored here)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from flatcake.config import FlatCakeConfig, load_config
from flatcake.connectors.requests import RequestView
from tests.connectors.sides_harness import G, Harness, end, finish, random_kv, tokens, view

S0 = list(range(100, 113))       # session s, turn 0: 3 full blocks + 1 token
S1 = tokens(S0[:12], 9, 200)     # turn 1: 5 full blocks + 1 token
T0 = list(range(500, 513))       # session t: 3 full blocks + 1 token
# The owner's paged KV slot of each request block of each prompt.
OWNER_SLOTS = {"s0": [5, 6, 7], "s1": [5, 6, 7, 9, 10], "t": [20, 21, 22]}
PROMPTS = {"s0": S0, "s1": S1, "t": T0}


def node_settings(node: int, url: str, cluster: str) -> FlatCakeConfig:
    return load_config(env={}, overrides=[
        "store.memory_capacity_bytes=1048576", "store.ssd_capacity_bytes=67108864",
        "store.session_file_bytes=16777216", "placement.short_reply_threshold_tokens=512",
        "placement.memory_copy_watermark=0", f"store.node_id={node}",
        f"store.cluster_url={url}", f"store.cluster_name={cluster}",
        "store.remote_timeout_s=3", "store.remote_window_bytes=1048576"])


def owner(h: Harness) -> None:
    p0 = finish(h, "s0", S0, [5, 6, 7, 8], out=3, session="s")
    h.step()
    p1 = finish(h, "s1", S1, [5, 6, 7, 9, 10, 11], out=3, session="s")
    h.step()
    pt = finish(h, "t", T0, [20, 21, 22, 23], out=3, session="t")
    h.step()
    assert h.worker.cluster is not None and h.worker.cluster.service.flush()
    placed = [p0["placement"], p1["placement"], pt["placement"]]
    print(json.dumps({"placed": placed, "published": h.worker.cluster.service.published}),
          flush=True)
    print("ready", flush=True)
    time.sleep(120)


class Asker:
    """Node 1: looks up, loads and checks one request at a time."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.want = random_kv(0)  # the owner's paged KV
        self.n = 0
        self.v: RequestView | None = None
        self.name = ""
        self.local = 0
        self.matched = 0
        self.slots: list[int] = []

    def lookup(self, name: str, local_blocks: int) -> dict[str, Any]:
        self.n += 1
        self.name, self.local = name, local_blocks
        toks = tokens(PROMPTS[name], 6, 900 + 10 * self.n)
        self.v = view(f"r{self.n}", toks, computed=local_blocks * G.tokens_per_block)
        n, is_async = self.h.sched.num_matched_tokens(self.v, local_blocks * G.tokens_per_block)
        self.matched = n or 0
        return {"matched": n, "async": is_async}

    def load(self) -> dict[str, Any]:
        assert self.v is not None
        self.slots = list(range(30 + 8 * (self.n % 3), 30 + 8 * (self.n % 3) + 8))
        before = [[bytes(self.h.block(layer, s)) for s in self.slots] for layer in range(3)]
        self.h.sched.after_alloc(self.v.request_id, self.slots, self.matched)
        plan, _, recving, invalid = self.h.step()
        bs = G.tokens_per_block
        blocks = range(self.local, self.local + self.matched // bs)
        ok = [i for i in blocks if self.slots[i] not in invalid]
        owner_slots = OWNER_SLOTS[self.name]
        exact = all(self.h.block(layer, self.slots[i]) == self._want(layer, owner_slots[i])
                    for layer in range(3) for i in ok)
        # Every other slot (the engine's own prefix, blocks that failed) is untouched.
        others = [j for j in range(len(self.slots)) if j not in ok]
        untouched = all(self.h.block(layer, self.slots[j]) == before[layer][j]
                        for layer in range(3) for j in others)
        rid = self.v.request_id
        _, params = end(self.h, RequestView(rid, self.v.keys, self.v.num_tokens,
                                            self.v.num_tokens, 0, self.v.num_tokens))
        return {"loads": [(t.request_id, t.sync, len(t.remote)) for t in plan.loads],
                "recving": sorted(recving), "invalid": sorted(self.slots.index(s)
                                                              for s in invalid),
                "exact": exact, "untouched": untouched, "params": params["flatcake"]}

    def _want(self, layer: int, slot: int) -> bytes:
        return self.want[layer][slot].contiguous().view(torch.uint8).numpy().tobytes()

    def store(self) -> dict[str, Any]:
        """The last request again, computed here: its prompt is stored on this node."""
        assert self.v is not None
        v = view(f"w{self.n}", PROMPTS[self.name], computed=len(PROMPTS[self.name]))
        self.h.sched.num_matched_tokens(v, v.num_tokens)
        _, params = end(self.h, v, self.slots)
        self.h.step()
        return {"stored_blocks": params["flatcake"].get("stored_blocks", 0)}


def main() -> None:
    mode, url, cluster, root = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
    torch.set_num_threads(1)
    node = 0 if mode == "owner" else 1
    h = Harness(root / f"n{node}", node_settings(node, url, cluster), seed=node)
    try:
        if mode == "owner":
            owner(h)
            return
        asker = Asker(h)
        print("ready", flush=True)
        for line in sys.stdin:
            cmd, *args = line.split()
            if cmd == "lookup":
                out = asker.lookup(args[0], int(args[1]))
            elif cmd == "load":
                out = asker.load()
            else:
                out = asker.store()
            print(json.dumps(out), flush=True)
    finally:
        h.close()


if __name__ == "__main__":
    main()
