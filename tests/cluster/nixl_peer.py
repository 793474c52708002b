"""A node process for the NIXL tests (run by the NIXL venv's python, not imported by pytest).

    nixl_peer.py owner URL CLUSTER NODE   # publish an arena of known bytes, wait on stdin
    nixl_peer.py ssd-owner URL CLUSTER NODE DIR  # the same bytes in DIR/seg.bin, staged
    nixl_peer.py ssd-reader URL CLUSTER NODE     # fetch them in 4 parts, check crc + bytes
    nixl_peer.py reader URL CLUSTER NODE [REPEATS [survive]]
        # find node 0's blocks, READ them REPEATS times, print JSON; with "survive", read
        # once, wait for a line on stdin (the test kills the owner), read again

Both sides build the same arena from a seed, so the reader checks every byte it got.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
import zlib

import numpy as np

from flatcake.cio.remote import NixlNode
from flatcake.cluster import ClusterIndex
from flatcake.control.address import Address, Medium, encode_address

MIB = 1 << 20
ARENA = 64 * MIB
BLOCKS = 32


def arena() -> np.ndarray:
    return np.random.default_rng(15).integers(0, 256, ARENA, dtype=np.uint8)


def keys() -> list[bytes]:
    return [hashlib.blake2b(b"nixl%d" % i, digest_size=32).digest() for i in range(BLOCKS)]


def owner(url: str, cluster: str, node: int) -> None:
    mem = arena()
    agent = NixlNode(f"fc-node-{node}", mem, MIB, progress_thread=True)
    idx = ClusterIndex(url, node, cluster=cluster, lease_ms=60_000)
    idx.join()
    addrs = [encode_address(Medium.MEMORY, node, 2 * MIB * j) for j in range(BLOCKS)]
    assert idx.publish_agent(agent.metadata(), agent.record())
    assert idx.publish([(1, keys(), addrs, {"block_bytes": MIB})])
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes our stdin (or kills us)
    agent.close()


def reader(url: str, cluster: str, node: int) -> None:
    idx = ClusterIndex(url, node, cluster=cluster, timeout_s=2.0)
    idx.join()
    agent = NixlNode(f"fc-node-{node}", np.zeros(MIB, np.uint8), BLOCKS * MIB)
    hits = idx.lookup(keys())
    out: dict[str, object] = {"hits": len(hits)}
    found = idx.agent(0) if hits else None
    if found is None:
        out.update(ok=False, miss="no live owner")
        print(json.dumps(out), flush=True)
        return
    md, record = found
    peer = agent.connect(md)
    if peer is None:
        out.update(ok=False, miss="owner unreachable")
        print(json.dumps(out), flush=True)
        return
    ranges = [(Address.decode(h.address).offset, int(h.record["block_bytes"])) for h in hits]
    expect = arena()
    want = np.concatenate([expect[o:o + n] for o, n in ranges])
    remote_s, local_s, ok = [], [], True
    dst = np.empty_like(want)
    for _ in range(int(sys.argv[5]) if len(sys.argv) > 5 else 3):
        t = time.perf_counter()
        got = agent.read(peer, record, ranges, timeout_s=10.0)
        remote_s.append(time.perf_counter() - t)
        if got is None:
            out.update(ok=False, miss="read failed")
            print(json.dumps(out), flush=True)
            return
        ok = ok and bool(np.array_equal(got, want))
        t = time.perf_counter()
        at = 0
        for o, n in ranges:
            dst[at:at + n] = expect[o:o + n]
            at += n
        local_s.append(time.perf_counter() - t)
    if len(sys.argv) > 6:  # survive the owner: wait for the word, then read again
        print(json.dumps({"first": ok}), flush=True)
        sys.stdin.readline()
        t = time.perf_counter()
        again = agent.read(peer, record, ranges, timeout_s=5.0)
        out.update(ok=ok, after_kill=None if again is None else bool(np.array_equal(again, want)),
                   waited_s=time.perf_counter() - t)
        print(json.dumps(out), flush=True)
        return
    out.update(ok=ok, bytes=int(want.nbytes),
               remote_gbps=want.nbytes / min(remote_s) / 1e9,
               local_gbps=want.nbytes / min(local_s) / 1e9)
    print(json.dumps(out), flush=True)
    agent.close()


SSD_BYTES = 16 * MIB
PARTS, PER_PART, PIECE = 4, 8, 256 * 1024  # 4 "layers" of 8 ranges of 256 KiB


def ssd_parts() -> list[list[tuple[str, int, int]]]:
    return [[("seg.bin", (p * PER_PART + j) * 2 * PIECE, PIECE) for j in range(PER_PART)]
            for p in range(PARTS)]


def ssd_owner(url: str, cluster: str, node: int) -> None:
    import threading
    from pathlib import Path

    from flatcake.cio.remote_ssd import StagingServer

    root = Path(sys.argv[5])
    data = arena()[:SSD_BYTES]
    (root / "seg.bin").write_bytes(data.tobytes())
    crcs = [zlib.crc32(b"".join(data[o:o + n].tobytes() for _, o, n in part))
            for part in ssd_parts()]
    idx = ClusterIndex(url, node, cluster=cluster, lease_ms=60_000)
    idx.join()
    agent = NixlNode(f"fc-node-{node}-{idx.epoch}", np.zeros(MIB, np.uint8), MIB)

    def resolve(name: str) -> bytes | None:
        # Agent names carry the node's epoch: a restarted requester is a new agent.
        _, _, peer_node, _epoch = name.split("-")
        found = idx.agent(int(peer_node))
        return None if found is None or found[1]["agent"] != name else found[0]

    server = StagingServer(agent, lambda f: str(root / f) if f == "seg.bin" else None,
                           resolve, PER_PART * PIECE)
    addrs = [encode_address(Medium.SSD, node, 0)]
    assert idx.publish_agent(agent.metadata(), agent.record())
    assert idx.publish([(1, keys()[:1], addrs, {"file": "seg.bin", "crcs": crcs})])
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    print("ready", flush=True)
    while not stop.is_set():
        if not server.serve_once():
            time.sleep(0.001)
    server.close()
    agent.close()


def ssd_reader(url: str, cluster: str, node: int) -> None:
    from flatcake.cio.remote_ssd import fetch

    idx = ClusterIndex(url, node, cluster=cluster)
    idx.join()
    agent = NixlNode(f"fc-node-{node}-{idx.epoch}", np.zeros(MIB, np.uint8), SSD_BYTES)
    assert idx.publish_agent(agent.metadata(), agent.record())  # the owner writes to us
    hits = idx.lookup(keys()[:1])
    found = idx.agent(0)
    peer = agent.connect(found[0]) if hits and found else None
    if peer is None:
        print(json.dumps({"ok": False, "miss": "no live owner"}), flush=True)
        return
    t = time.perf_counter()
    got = fetch(agent, peer, ssd_parts(), timeout_s=10.0)
    took = time.perf_counter() - t
    if got is None:
        print(json.dumps({"ok": False, "miss": "fetch failed"}), flush=True)
        return
    size = PER_PART * PIECE
    crcs = [zlib.crc32(got[i * size:(i + 1) * size].tobytes()) for i in range(PARTS)]
    corrupt = crcs != hits[0].record["crcs"]  # checked before any block is used
    data = arena()[:SSD_BYTES]
    want = np.concatenate([data[o:o + n] for part in ssd_parts() for _, o, n in part])
    print(json.dumps({"ok": not corrupt and bool(np.array_equal(got, want)),
                      "corrupt": corrupt, "gbps": want.nbytes / took / 1e9}), flush=True)
    agent.close()


if __name__ == "__main__":
    role, url, cluster, node = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    {"owner": owner, "reader": reader, "ssd-owner": ssd_owner,
     "ssd-reader": ssd_reader}[role](url, cluster, node)
