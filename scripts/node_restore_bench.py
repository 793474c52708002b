"""Restore GB/s through one node service: 4 processes, each a ``FlatCakeStore``
attached to ``flatcake serve``, restoring their sessions at once, against one attached
process restoring the same sessions alone (the same service, the same files, the same
run, alternated). Every restored byte is compared with what was written.

    python scripts/node_restore_bench.py [--sessions 8] [--blocks 256] [--rounds 2]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from flatcake.config import load_config
from flatcake.control.keys import chain_block_keys
from flatcake.geometry import KVGeometry
from flatcake.store import FlatCakeStore, TurnSignals

G = KVGeometry(num_layers=16, tokens_per_block=16, num_kv_heads=8, head_dim=64,
               dtype="bfloat16", name="bench")  # 32 KiB per block per layer


def keys_of(session: int, blocks: int) -> list[bytes]:
    toks = [session * 1_000_003 + i for i in range(blocks * G.tokens_per_block)]
    return chain_block_keys(toks, G.tokens_per_block, G.name)


def kv_of(seed: int, blocks: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shape = (2, blocks, G.tokens_per_block, G.num_kv_heads, G.head_dim)
    return [torch.randint(-2**15, 2**15, shape, generator=gen, dtype=torch.int16)
            .view(torch.bfloat16) for _ in range(G.num_layers)]


def config(sock: Path) -> object:
    return load_config(env={}, overrides=[f"store.node=unix:{sock}",
                                          "store.node_timeout_s=30"])


def restore(sock: str, sessions: list[int], blocks: int, start: object, out: object) -> None:
    store = FlatCakeStore.open(Path("unused"), G, config(Path(sock)))  # type: ignore[arg-type]
    try:
        kvs = {s: kv_of(s, blocks) for s in sessions}
        got = [torch.empty_like(t) for t in kv_of(0, blocks)]
        start.wait()  # type: ignore[attr-defined]
        t0, c0, moved, exact = time.perf_counter(), time.process_time(), 0, True
        for s in sessions:
            res = store.load(keys_of(s, blocks), got, list(range(blocks)))
            moved += res.bytes_read
            exact &= res.num_blocks == blocks and all(torch.equal(
                a.view(torch.int16), b.view(torch.int16)) for a, b in zip(got, kvs[s], strict=True))
        out.put((time.perf_counter() - t0, time.process_time() - c0, moved, exact))  # type: ignore[attr-defined]
    finally:
        store.close()


def run(sock: Path, groups: list[list[int]], blocks: int) -> tuple[float, float, bool]:
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(len(groups) + 1), ctx.Queue()
    procs = [ctx.Process(target=restore, args=(str(sock), g, blocks, start, out))
             for g in groups]
    for p in procs:
        p.start()
    start.wait()
    t0 = time.perf_counter()
    results = [out.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join(timeout=60)
    moved = sum(r[2] for r in results)
    if os.environ.get("BENCH_DEBUG"):
        print("  per process wall s:", [round(r[0], 3) for r in results], "run", round(wall, 3))
    return moved / wall / 1e9, sum(r[1] for r in results) * 1e9 / max(moved, 1), \
        all(r[3] for r in results)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir", default=None, help="store root parent (default: a temp dir)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="flatcake-node-bench-", dir=args.dir))
    sock, shm = tmp / "run" / "node.sock", tmp / "shm"
    shm.mkdir()
    gib = 1 << 30
    svc = subprocess.Popen([sys.executable, "-m", "flatcake.cli", "serve", "--root",
                            str(tmp / "root"), "--socket", str(sock), "--set",
                            f"store.node_arena_dir={shm}", "--set",
                            "store.memory_capacity_bytes=0", "--set",
                            f"store.ssd_capacity_bytes={8 * gib}", "--set",
                            "placement.memory_copy_watermark=0"],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert svc.stdout is not None and svc.stdout.readline().startswith("ready")
        writer = FlatCakeStore.open(tmp, G, config(sock))  # type: ignore[arg-type]
        for s in range(args.sessions):
            writer.store_turn(f"s{s}", keys_of(s, args.blocks), kv_of(s, args.blocks),
                              list(range(args.blocks)), TurnSignals(0, 10**6))
        writer.close()
        size = args.sessions * args.blocks * G.block_bytes_per_layer * G.num_layers
        print(f"{args.sessions} sessions x {args.blocks} blocks x {G.num_layers} layers "
              f"= {size / gib:.2f} GiB on SSD; load average {os.getloadavg()[0]:.2f}")
        sessions = list(range(args.sessions))
        rows = []
        for _ in range(args.rounds):
            for name, groups in (("1 process", [sessions]),
                                 ("4 processes", [sessions[i::4] for i in range(4)])):
                gbps, ns, exact = run(sock, groups, args.blocks)
                rows.append((name, gbps, ns, exact))
                print(f"{name:12s} {gbps:6.2f} GB/s  {ns:6.2f} CPU ns/B  exact={exact}",
                      flush=True)
        one = sorted(r[1] for r in rows if r[0] == "1 process")
        four = sorted(r[1] for r in rows if r[0] == "4 processes")
        print(f"4 processes / 1 process (medians): {four[len(four) // 2] / one[len(one) // 2]:.2f}"
              f"; load average {os.getloadavg()[0]:.2f}")
    finally:
        svc.terminate()
        svc.wait(timeout=15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
