"""Two engines, one attached to each of two node services in one cluster, for
tests/cluster/test_service_requeue.py. Runs with torch and NIXL importable; one command
per stdin line, one JSON line per answer:

    write FIRST LAST [two]
                       the owner (attached to node A) writes sessions FIRST..LAST-1,
                       each a first turn of 3 blocks on SSD; with ``two`` the last one
                       also a second turn whose 2 blocks go to memory (two segments)
    check N WAIT       per session 0..N-1, the blocks node A holds (the owner's local
                       hit) and the blocks the asker (attached to node B) finds on other
                       nodes, asked again until it finds what A holds or WAIT s pass

    requeue_peer.py SOCK_A SOCK_B
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from flatcake.connectors.scheduler_side import RequestView
from tests.connectors.sides_harness import G, end, finish, tokens, view
from tests.service.helpers import Engine

TURNS: dict[int, list[int]] = {}  # session -> the prompt whose blocks node A may hold


def write(owner: Engine, sid: int, two_turns: bool) -> None:
    turn0 = list(range(1000 * (sid + 1), 1000 * (sid + 1) + 13))  # 3 blocks + 1 token
    p = finish(owner, f"w{sid}", turn0, [5, 6, 7, 8], out=3, session=f"s{sid}")
    assert p["placement"] == "ssd:first_turn", p
    owner.step()
    owner.step()  # a drop rides the step after the reclaim
    TURNS[sid] = turn0[:12]
    if not two_turns:
        return
    turn1 = tokens(turn0, 8, 200)
    v = view(f"w{sid}b", turn1, session=f"s{sid}")
    assert owner.sched.num_matched_tokens(v, 0) == (12, True)
    owner.sched.after_alloc(v.request_id, [20, 21, 22, 23, 24], 12)
    owner.step()
    _, params = end(owner, RequestView(v.request_id, v.keys, len(turn1), len(turn1), 3, 12,
                                       f"s{sid}"), [20, 21, 22, 23, 24])
    assert params["flatcake"]["placement"] == "memory:short_reply", params
    owner.step()
    TURNS[sid] = turn1[:20]


class Looker:
    def __init__(self, engine: Engine, tag: str) -> None:
        self.e, self.tag, self.n = engine, tag, 0

    def blocks(self, sid: int) -> int:
        """Blocks of session ``sid``'s prompt this engine's lookup matches."""
        self.n += 1
        prompt = tokens(TURNS[sid], 8, 900)
        n, _ = self.e.sched.num_matched_tokens(view(f"{self.tag}{self.n}", prompt), 0)
        return (n or 0) // G.tokens_per_block


def main() -> None:
    sock_a, sock_b = Path(sys.argv[1]), Path(sys.argv[2])
    torch.set_num_threads(1)
    owner, asker = Engine(sock_a, seed=10, name="owner"), Engine(sock_b, seed=30, name="asker")
    held_by, found_by = Looker(owner, "h"), Looker(asker, "f")
    try:
        print("ready", flush=True)
        for line in sys.stdin:
            cmd, *args = line.split()
            if cmd == "write":
                first, last = int(args[0]), int(args[1])
                for sid in range(first, last):
                    write(owner, sid, two_turns=sid == last - 1 and "two" in args)
                print(json.dumps({"written": last - first}), flush=True)
            elif cmd == "check":
                sessions, deadline = range(int(args[0])), time.monotonic() + float(args[1])
                held = [held_by.blocks(s) for s in sessions]
                while True:
                    found = [found_by.blocks(s) for s in sessions]
                    if found == held or time.monotonic() >= deadline:
                        break
                    time.sleep(0.3)
                print(json.dumps({"held": held, "found": found}), flush=True)
    finally:
        asker.close()
        owner.close()


if __name__ == "__main__":
    main()
