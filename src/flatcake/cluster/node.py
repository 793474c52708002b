"""One node of a FlatCake cluster: its cluster-index entry, its NIXL agent, its staging
server, and the demo workload that writes blocks on one node and restores them on another.

A node owns a host arena (served to peers by NIXL READ) and files under its root (served
by the owner-staged WRITE path). ``write_blocks`` puts blocks of known bytes (a seed) in
both media, makes the files durable (fsync), and only then publishes them; ``restore``
finds another node's blocks in the index, reads each medium over its path, checks the
CRC32 of every block before it counts, and reports GB/s per path. Block keys are built
in the tenant's namespace (``namespace_key``), so two tenants never see each other's
blocks, on one node or across nodes.
"""

from __future__ import annotations

import hashlib
import os
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from flatcake.cio.remote import NixlNode
from flatcake.cio.remote_ssd import StagingServer, fetch
from flatcake.cluster.index import ClusterIndex, RemoteHit
from flatcake.control.address import Address, Medium, encode_address
from flatcake.control.keys import namespace_key

FILE = "blocks.bin"


def demo_keys(seed: int, count: int, tenant: str, medium: Medium) -> list[bytes]:
    ns = namespace_key("flatcake-cluster-demo", tenant)
    return [hashlib.blake2b(f"{seed}:{int(medium)}:{i}".encode(), key=ns,
                            digest_size=32).digest() for i in range(count)]


def demo_bytes(seed: int, count: int, block_bytes: int, medium: Medium) -> np.ndarray:
    rng = np.random.default_rng([seed, int(medium)])
    return rng.integers(0, 256, count * block_bytes, dtype=np.uint8)


class ClusterNode:
    """A node: ``node`` id, Redis ``url``, files under ``root``, an arena of
    ``arena_bytes`` and a receive window of ``window_bytes``."""

    def __init__(self, node: int, url: str, root: str | os.PathLike[str], *,
                 arena_bytes: int, window_bytes: int, stage_bytes: int = 8 << 20,
                 cluster: str = "flatcake",
                 lease_ms: int = 10_000, progress_thread: bool = False) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.index = ClusterIndex(url, node, cluster=cluster, lease_ms=lease_ms)
        self.index.join()
        self.agent = NixlNode(f"fc-node-{node}-{self.index.epoch}",
                              np.zeros(arena_bytes, np.uint8), window_bytes,
                              progress_thread=progress_thread)
        self.staging = StagingServer(self.agent, self._file, self._resolve, stage_bytes)
        if not self.index.publish_agent(self.agent.metadata(), self.agent.record()):
            raise RuntimeError("cannot publish this node's agent in the cluster index")
        self._renewed = time.monotonic()

    @property
    def node(self) -> int:
        return self.index.node

    def _file(self, file_id: str) -> str | None:
        path = self.root / file_id
        return str(path) if file_id == FILE and path.is_file() else None

    def _resolve(self, agent_name: str) -> bytes | None:
        parts = agent_name.split("-")
        if len(parts) != 4 or not parts[2].isdigit():
            return None
        found = self.index.agent(int(parts[2]))
        return None if found is None or found[1]["agent"] != agent_name else found[0]

    def write_blocks(self, seed: int, count: int, block_bytes: int, tenant: str = "") -> None:
        """``count`` blocks in memory and ``count`` on SSD, published once durable."""
        if count <= 0 or block_bytes <= 0 or count * block_bytes > self.agent.arena.nbytes:
            raise ValueError(f"{count} blocks of {block_bytes} bytes do not fit the arena")
        mem = demo_bytes(seed, count, block_bytes, Medium.MEMORY)
        self.agent.arena[:mem.nbytes] = mem
        ssd = demo_bytes(seed, count, block_bytes, Medium.SSD)
        path = self.root / FILE
        with path.open("wb") as f:
            f.write(ssd.tobytes())
            f.flush()
            os.fsync(f.fileno())  # durable before it is published
        segments = []
        for medium, data in ((Medium.MEMORY, mem), (Medium.SSD, ssd)):
            crcs = [zlib.crc32(data[j * block_bytes:(j + 1) * block_bytes].tobytes())
                    for j in range(count)]
            addrs = [encode_address(medium, self.node, j * block_bytes) for j in range(count)]
            segments.append((int(medium), demo_keys(seed, count, tenant, medium), addrs,
                             {"file": FILE, "block_bytes": block_bytes, "crcs": crcs}))
        if not self.index.publish(segments):
            raise RuntimeError("cannot publish the blocks in the cluster index")

    def serve(self, seconds: float) -> None:
        """Answer staging requests and keep the lease for ``seconds``."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.serve_once()

    def serve_once(self) -> None:
        if not self.staging.serve_once():
            time.sleep(0.001)
        if time.monotonic() - self._renewed > self.index.lease_ms / 3000:
            self.index.renew()
            self._renewed = time.monotonic()

    def restore(self, seed: int, count: int, tenant: str = "", *,
                timeout_s: float = 10.0) -> dict[str, Any]:
        """Restore another node's demo blocks; bytes, GB/s and checks per path."""
        out: dict[str, Any] = {}
        for medium, path in ((Medium.MEMORY, "remote_memory"), (Medium.SSD, "remote_ssd")):
            keys = demo_keys(seed, count, tenant, medium)
            hits = self.index.lookup(keys)
            # Twice: the first connects (endpoints, metadata); the second is reported.
            first = self._restore(hits, medium, seed, count, timeout_s)
            out[path] = self._restore(hits, medium, seed, count, timeout_s)
            out[path]["ok"] = out[path]["ok"] and first["ok"]
            out[path]["hits"] = len(hits)
        return out

    def _restore(self, hits: list[RemoteHit], medium: Medium, seed: int, count: int,
                 timeout_s: float) -> dict[str, Any]:
        if len(hits) < count or len({h.node for h in hits}) != 1:
            return {"ok": False, "miss": "not all blocks found on one live node"}
        found = self.index.agent(hits[0].node)
        peer = None if found is None else self.agent.connect(found[0])
        if found is None or peer is None:
            return {"ok": False, "miss": "owner unreachable"}
        size = int(hits[0].record["block_bytes"])
        ranges = [(Address.decode(h.address).offset, size) for h in hits]
        t = time.perf_counter()
        if medium == Medium.MEMORY:
            got = self.agent.read(peer, found[1], ranges, timeout_s=timeout_s)
        else:
            # Parts of up to 4 MiB (a layer's share, say): the owner stages one while the
            # previous one is in flight to us.
            per = max(1, (4 << 20) // size)
            flat = [(str(h.record["file"]), off, n) for h, (off, n) in zip(hits, ranges,
                                                                           strict=True)]
            parts = [flat[i:i + per] for i in range(0, len(flat), per)]
            got = fetch(self.agent, peer, parts, timeout_s=timeout_s)
        took = time.perf_counter() - t
        if got is None:
            return {"ok": False, "miss": "read failed or timed out"}
        bad = sum(zlib.crc32(got[i * size:(i + 1) * size].tobytes())
                  != h.record["crcs"][h.position] for i, h in enumerate(hits))
        want = demo_bytes(seed, count, size, medium)
        want = np.concatenate([want[o:o + n] for o, n in ranges])
        return {"ok": bad == 0 and bool(np.array_equal(got, want)), "bad_blocks": bad,
                "bytes": int(got.nbytes), "gb_s": got.nbytes / took / 1e9}

    def local_figures(self, count: int, block_bytes: int) -> dict[str, float]:
        """The same bytes copied in local memory and read from a local file (GB/s)."""
        src = np.random.default_rng(1).integers(0, 256, count * block_bytes, dtype=np.uint8)
        dst = np.empty_like(src)
        for _ in range(2):  # the first pass faults the pages in, as the window's first read
            t = time.perf_counter()
            for j in range(count):
                dst[j * block_bytes:(j + 1) * block_bytes] = src[j * block_bytes:(j + 1) *
                                                                 block_bytes]
            mem_s = time.perf_counter() - t
        path = self.root / "local.bin"
        with path.open("wb") as f:
            f.write(src.tobytes())
            f.flush()
            os.fsync(f.fileno())
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # read from the device
            t = time.perf_counter()
            for j in range(count):
                os.preadv(fd, [dst[j * block_bytes:(j + 1) * block_bytes].data],
                          j * block_bytes)
            ssd_s = time.perf_counter() - t
        finally:
            os.close(fd)
            path.unlink()
        return {"local_memory": src.nbytes / mem_s / 1e9, "local_ssd": src.nbytes / ssd_s / 1e9}

    def close(self) -> None:
        self.index.leave()
        self.staging.close()
        self.agent.close()
        self.index.close()
