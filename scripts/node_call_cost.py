"""Scheduler-side CPU cost of the node service's calls, beside the embedded half's:
a lookup of a 2,048-block prompt (a miss: nothing stored) and a step with nothing to
load, each timed over many calls (CPU seconds of this process: what the engine's
scheduler thread pays; wall time beside it). Starts ``flatcake serve`` on a temporary
root, bounded by timeouts.

    python scripts/node_call_cost.py [--calls N]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flatcake.config import load_config
from flatcake.connectors.node_client import RemoteSchedulerSide
from flatcake.connectors.scheduler_side import RequestView, SchedulerSide
from flatcake.connectors.settings import ConnectorSettings
from flatcake.control.keys import chain_block_keys
from flatcake.geometry import KVGeometry

G = KVGeometry(num_layers=32, tokens_per_block=16, num_kv_heads=8, head_dim=128,
               dtype="bfloat16", name="llama-3.1-8b")


def timed(fn, calls: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    fn()
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(calls):
        fn()
    return ((time.process_time() - c0) / calls * 1e6, (time.perf_counter() - w0) / calls * 1e6)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="flatcake-cost-"))
    sock = tmp / "run" / "node.sock"
    (tmp / "shm").mkdir()
    cmd = [sys.executable, "-m", "flatcake.cli", "serve", "--root", str(tmp / "root"),
           "--socket", str(sock), "--set", f"store.node_arena_dir={tmp / 'shm'}",
           "--set", "store.memory_capacity_bytes=67108864"]
    svc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert svc.stdout is not None and svc.stdout.readline().startswith("ready")
        keys = tuple(chain_block_keys(list(range(2048 * 16)), 16, G.name))
        req = RequestView("r", keys, len(keys) * 16 + 1, len(keys) * 16 + 1, 0, 0, "s")
        base = ["store.memory_capacity_bytes=67108864", f"store.node=unix:{sock}"]
        remote = RemoteSchedulerSide(G, ConnectorSettings(load_config(env={},
                                                                      overrides=base)))
        local = SchedulerSide(G, ConnectorSettings(load_config(env={}, overrides=base[:1])),
                              tmp / "embedded")
        rows = []
        for name, side in (("embedded", local), ("node service", remote), ("embedded", local),
                           ("node service", remote)):
            look = timed(lambda s=side: s.num_matched_tokens(req, 0), args.calls)
            step = timed(lambda s=side: s.build_step(), args.calls * 10)
            rows.append((name, *look, *step))
        print(f"load average {os.getloadavg()[0]:.2f}; {args.calls} calls each")
        print(f"{'half':14s} {'lookup 2048 CPU us':>19s} {'wall us':>9s} "
              f"{'empty step CPU us':>18s} {'wall us':>9s}")
        for name, lc, lw, sc, sw in rows:
            print(f"{name:14s} {lc:19.1f} {lw:9.1f} {sc:18.2f} {sw:9.2f}")
        remote.close()
    finally:
        svc.terminate()
        svc.wait(timeout=15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
