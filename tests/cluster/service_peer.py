"""Two engines attached to two node services, each service its node's member of the
cluster, for tests/cluster/test_service_cluster.py. Runs with torch and NIXL importable;
prints one JSON line per result.

    service_peer.py LAYOUT SOCK_A SOCK_B

LAYOUT is ``tp1``, ``split`` (tensor_parallel_size=2, heads split) or ``mla``
(tensor_parallel_size=2, replicated latent). The owner, attached to node A, stores
session s (turn 0: 3 blocks on SSD; turn 1's short reply: 2 more in memory); the asker,
attached to node B, restores all 5 from node A into other slots of every rank and
prints what each rank got against the owner's bytes of the part that rank reads. Then
one command per stdin line: ``again`` looks the same prompt up and loads it once more
(node A's service killed meanwhile: a miss, or load errors with every slot untouched).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from flatcake.connectors.scheduler_side import RequestView
from flatcake.link.wire import TensorRanks
from tests.connectors.sides_harness import G, end, finish, tokens, view
from tests.service.helpers import TensorEngine

LAYOUTS = {"tp1": TensorRanks(1), "split": TensorRanks(2),
           "mla": TensorRanks(2, replicated=True)}
SLOTS = list(range(40, 48))  # the asker's slots of the restored prompt


def write(owner: TensorEngine) -> tuple[list[int], dict[tuple[int, int, int], bytes]]:
    """Session s on node A: 3 SSD blocks, then 2 memory blocks; each part's bytes of
    every block (part p: what rank p holds; a replicated part: rank 0's)."""
    turn0 = list(range(100, 113))
    p = finish(owner, "t0", turn0, [5, 6, 7, 8], out=3, session="s")
    assert p["placement"] == "ssd:first_turn", p
    owner.step()
    turn1 = tokens(turn0, 8, 200)
    assert owner.sched.num_matched_tokens(view("t1", turn1, session="s"), 0) == (12, True)
    owner.sched.after_alloc("t1", [20, 21, 22, 23, 24], 12)
    owner.step()
    _, params = end(owner, RequestView("t1", view("t1", turn1).keys, len(turn1), len(turn1),
                                       3, 12, "s"), [20, 21, 22, 23, 24])
    assert params["flatcake"]["placement"] == "memory:short_reply", params
    owner.step()
    parts = len({owner.sched.ranks.part(r) for r in range(owner.sched.ranks.world_size)})
    want = {(part, layer, j): owner.rank_block(part, layer, slot)
            for part in range(parts) for layer in range(G.num_layers)
            for j, slot in enumerate([5, 6, 7, 23, 24])}
    return tokens(turn1[:20], 8, 300), want


class Asker:
    def __init__(self, engine: TensorEngine, prompt: list[int],
                 want: dict[tuple[int, int, int], bytes]) -> None:
        self.e, self.prompt, self.want, self.n = engine, prompt, want, 0

    def lookup(self, wait_s: float, blocks: int = 5) -> int:
        """Blocks matched (asked again until node A's publishes of all ``blocks`` show,
        up to ``wait_s``)."""
        deadline = time.monotonic() + wait_s
        while True:
            self.n += 1
            n, _ = self.e.sched.num_matched_tokens(
                view(f"a{self.n}", self.prompt, session="x"), 0)
            if (n or 0) >= blocks * G.tokens_per_block or time.monotonic() >= deadline:
                return (n or 0) // G.tokens_per_block
            time.sleep(0.2)

    def load(self, blocks: int) -> dict[str, Any]:
        ranks = self.e.sched.ranks
        before = {(r, layer, s): self.e.rank_block(r, layer, s)
                  for r in range(ranks.world_size) for layer in range(G.num_layers)
                  for s in SLOTS}
        rid = f"a{self.n}"
        self.e.sched.after_alloc(rid, SLOTS, blocks * G.tokens_per_block)
        _, _, recving, invalid = self.e.step()
        bad = sorted(SLOTS.index(s) for s in invalid)
        exact, untouched = True, True
        for r in range(ranks.world_size):
            for layer in range(G.num_layers):
                for j, slot in enumerate(SLOTS):
                    got = self.e.rank_block(r, layer, slot)
                    if j < blocks and j not in bad:
                        exact &= got == self.want[(ranks.part(r), layer, j)]
                    else:
                        untouched &= got == before[(r, layer, slot)]
        stats = [w.take_stats() for w in self.e.workers]
        return {"recving": sorted(recving), "invalid": bad, "exact": exact,
                "untouched": untouched,
                "remote_bytes": [s.get("bytes_read_remote", 0) for s in stats]}


def main() -> None:
    layout, sock_a, sock_b = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    torch.set_num_threads(1)
    ranks = LAYOUTS[layout]
    owner = TensorEngine(sock_a, ranks, seed=10)
    asker = TensorEngine(sock_b, ranks, seed=30)
    try:
        prompt, want = write(owner)
        a = Asker(asker, prompt, want)
        found = a.lookup(30)
        out = a.load(found) if found else {}
        # Each rank's part differs from rank 0's unless the KV is replicated.
        parts_differ = want[(0, 0, 0)] != want.get((1, 0, 0), want[(0, 0, 0)])
        print(json.dumps({"matched": found, **out, "parts_differ": parts_differ}),
              flush=True)
        for line in sys.stdin:
            if line.strip() == "again":
                found = a.lookup(0)
                print(json.dumps({"matched": found, **(a.load(found) if found else {})}),
                      flush=True)
    finally:
        asker.close()
        owner.close()


if __name__ == "__main__":
    main()
