"""FlatCake stores in a cluster, for tests/cluster/test_store_cluster.py. Runs with torch
and NIXL importable (``store_python`` there); prints one JSON line per result.

    store_peer.py pair URL CLUSTER DIR      node 0 and node 1 in this process: the whole
                                            lifecycle (publish, restore, corrupt, drop,
                                            restart) and the checks of each step
    store_peer.py owner URL CLUSTER DIR [NODE SESSIONS]
                                            node NODE (0) writes the comma-separated
                                            SESSIONS (7), prints "ready", waits
    store_peer.py late URL CLUSTER DIR      node 0 opens before Redis answers: local-only,
                                            prints its state and "ready"; once Redis is
                                            there (started by the test) it joins, and
                                            node 1 restores what node 0 held
    store_peer.py restore URL CLUSTER DIR   node 1, per line on stdin (comma-separated
                                            sessions, "go" = 7): restores them all at
                                            once, prints each result and the order in
                                            which they finished
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from flatcake.cio.format import session_file_name
from flatcake.store import FlatCakeStore
from tests.store.helpers import (
    SMALL,
    TO_MEMORY,
    TO_SSD,
    block_bytes,
    empty_kv,
    random_kv,
    session_keys,
    small_config,
)

SLOTS = 16


def open_node(node: int, url: str, cluster: str, root: Path) -> FlatCakeStore:
    cfg = small_config(f"store.node_id={node}", f"store.cluster_url={url}",
                       f"store.cluster_name={cluster}", "store.remote_timeout_s=3",
                       "store.remote_window_bytes=1048576")
    return FlatCakeStore.open(root, SMALL, cfg)


def write(store: FlatCakeStore, session: int, ssd: int, memory: int) -> list[bytes]:
    """Session ``session``: ``ssd`` blocks on SSD, then ``memory`` more in memory."""
    kv = random_kv(SMALL, SLOTS, seed=session)
    keys = session_keys(session, ssd + memory)
    slots = list(range(ssd + memory))
    if ssd:
        store.store_turn(f"s{session}", keys[:ssd], kv, slots, TO_SSD)
    if memory:
        store.store_turn(f"s{session}", keys, kv, slots, TO_MEMORY)
    assert store._cluster is not None and store._cluster.service.flush()
    return keys


def restore(store: FlatCakeStore, session: int, n: int) -> dict[str, Any]:
    """Load session ``session``'s ``n`` keys; the result and whether every loaded block
    equals what the owner wrote."""
    got = empty_kv(SMALL, SLOTS)
    res = store.load(session_keys(session, n), got, list(range(n)))
    return checked(res, got, session)


def restore_at_once(store: FlatCakeStore, sessions: list[int], n: int) -> dict[str, Any]:
    """Start every session's load, then wait: each result, and the sessions in the
    order their loads finished."""
    started = []
    for session in sessions:
        got = empty_kv(SMALL, SLOTS)
        started.append((session, got, store.start_load(session_keys(session, n), got,
                                                       list(range(n)))))
    order: list[int] = []
    while len(order) < len(started):
        order += [s for s, _, h in started if s not in order and h.done()]
        time.sleep(0.002)
    out: dict[str, Any] = {str(s): checked(h.wait(), got, s) for s, got, h in started}
    out["order"] = order
    return out


def checked(res: Any, got: list[torch.Tensor], session: int) -> dict[str, Any]:
    want = random_kv(SMALL, SLOTS, seed=session)
    same = all(block_bytes(got, layer, b, "kv_blocks") == block_bytes(want, layer, b,
                                                                        "kv_blocks")
               for layer in range(SMALL.num_layers) for b in range(res.num_blocks))
    return {"blocks": res.num_blocks, "remote": res.num_remote_blocks, "exact": same,
            "hit": res.num_hit_blocks, "memory": res.num_memory_blocks,
            "ssd": res.num_ssd_blocks}


def corrupt(store: FlatCakeStore, session: int) -> None:
    """Flip one data byte of the session's first segment in its file on the owner."""
    seg = next(s for s in store.control.segments() if s.session_id == f"s{session}")
    path = store.root / "sessions" / session_file_name(int(seg.file_id or 0))
    with path.open("r+b") as f:
        at = int(seg.file_offset or 0) + seg.layout.header_bytes + 5
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x10]))


def pair(url: str, cluster: str, root: Path) -> None:
    out: dict[str, Any] = {}
    owner = open_node(0, url, cluster, root / "n0")
    asker = open_node(1, url, cluster, root / "n1")
    try:
        write(owner, 1, ssd=4, memory=3)
        write(owner, 2, ssd=4, memory=0)
        write(owner, 3, ssd=2, memory=0)
        out["epoch"] = owner._cluster.service.epoch if owner._cluster else 0
        out["remote"] = restore(asker, 1, 7)
        corrupt(owner, 2)
        out["corrupt"] = restore(asker, 2, 4)
        # A local prefix first: the asker holds session 1's first 2 blocks itself.
        asker.store_turn("s1", session_keys(1, 2), random_kv(SMALL, SLOTS, seed=1),
                         [0, 1], TO_SSD)
        out["local_then_remote"] = restore(asker, 1, 7)
        owner.drop_session("s1")
        assert owner._cluster is not None and owner._cluster.service.flush()
        out["dropped"] = restore(asker, 1, 7)
        owner.close()
        out["closed"] = restore(asker, 3, 2)
        owner = open_node(0, url, cluster, root / "n0")
        out["reopened_epoch"] = owner._cluster.service.epoch if owner._cluster else 0
        assert owner._cluster is not None and owner._cluster.service.flush()
        out["republished"] = restore(asker, 3, 2)
    finally:
        asker.close()
        owner.close()
    print(json.dumps(out), flush=True)


def late(url: str, cluster: str, root: Path) -> None:
    owner = open_node(0, url, cluster, root / "n0")
    assert owner._cluster is not None
    service = owner._cluster.service
    try:
        write(owner, 1, ssd=4, memory=3)
        write(owner, 2, ssd=2, memory=0)
        owner.drop_session("s2")  # dropped before the join: never published
        print(json.dumps({"joined": service.joined, "epoch": service.epoch,
                          "lookup": len(service.lookup(session_keys(1, 7))),
                          "local": restore(owner, 1, 7)}), flush=True)
        print("ready", flush=True)
        out: dict[str, Any] = {"joined": service.wait_joined(60)}
        out["flushed"] = service.flush()
        with open_node(1, url, cluster, root / "n1") as asker:
            out["remote"] = restore(asker, 1, 7)
            out["dropped"] = restore(asker, 2, 2)
    finally:
        owner.close()
    print(json.dumps(out), flush=True)


def main() -> None:
    mode, url, cluster, root = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
    torch.set_num_threads(1)
    if mode == "pair":
        pair(url, cluster, root)
    elif mode == "late":
        late(url, cluster, root)
    elif mode == "owner":
        node = int(sys.argv[5]) if len(sys.argv) > 5 else 0
        store = open_node(node, url, cluster, root / f"n{node}")
        for session in (sys.argv[6] if len(sys.argv) > 6 else "7").split(","):
            write(store, int(session), ssd=4, memory=3)
        print("ready", flush=True)
        time.sleep(120)
    elif mode == "restore":  # the sessions of each line read from stdin, at once
        with open_node(1, url, cluster, root / "n1") as store:
            print("ready", flush=True)
            for line in sys.stdin:
                sessions = [7] if line.strip() == "go" else [int(x) for x in line.split(",")]
                print(json.dumps(restore_at_once(store, sessions, 7)), flush=True)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
