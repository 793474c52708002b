"""``flatcake demo --nodes N``: a cluster on this machine, byte-exact through NIXL.

Starts a ``redis-server`` on 127.0.0.1 and N ``flatcake node`` processes with the NIXL
venv's python (``FLATCAKE_NIXL_PYTHON``, this interpreter when it has NIXL, or
``.venv-nixl`` beside the source): node 0 writes demo blocks in memory and on SSD, the
others serve; the last node restores them over remote memory (NIXL READ) and remote SSD
(owner-staged WRITE), checks every block, and the demo prints GB/s per path next to the
local memory copy and local SSD read of the same bytes. Every process has a deadline.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

import flatcake


def nixl_python() -> str:
    """The interpreter that runs nodes: FLATCAKE_NIXL_PYTHON, this one, or .venv-nixl."""
    env = os.environ.get("FLATCAKE_NIXL_PYTHON")
    if env:
        return env
    from flatcake.cio.remote import nixl_available

    if nixl_available() is None:
        return sys.executable
    for base in (Path.cwd(), Path(flatcake.__file__).resolve().parents[2]):
        candidate = base / ".venv-nixl" / "bin" / "python"
        if candidate.is_file():
            return str(candidate)
    raise ValueError("no NIXL here: run scripts/nixl_venv.sh (or set FLATCAKE_NIXL_PYTHON)")


def _pump(stream: IO[str], lines: queue.Queue[str]) -> None:
    for line in stream:
        if line.startswith("{"):
            lines.put(line)
    lines.put("")


def _json_line(lines: queue.Queue[str], deadline: float, who: str) -> dict[str, Any]:
    try:
        line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
    except queue.Empty:
        raise ValueError(f"{who} said nothing in time") from None
    if not line:
        raise ValueError(f"{who} exited early")
    out: dict[str, Any] = json.loads(line)
    return out


def run_cluster(args: argparse.Namespace) -> int:
    from flatcake.cluster import RedisServer, redis_available

    if not 2 <= args.nodes <= 8:
        raise ValueError(f"--nodes must be in [2, 8], got {args.nodes}")
    why = redis_available()
    if why:
        raise ValueError(why)
    python = nixl_python()
    blocks, block_kib, limit = args.cluster_blocks, 256, float(args.timeout_s)
    deadline = time.monotonic() + limit
    env = {**os.environ, "PYTHONPATH": str(Path(flatcake.__file__).resolve().parents[1])}
    procs: list[subprocess.Popen[str]] = []
    with RedisServer() as redis, tempfile.TemporaryDirectory(prefix=".flatcake-demo-",
                                                             dir=".") as tmp:
        print(f"redis {redis.url}; {args.nodes} nodes with {python}")
        try:
            for n in range(args.nodes - 1):
                cmd = [python, "-m", "flatcake.cli", "node", "--node-id", str(n), "--redis",
                       redis.url, "--root", f"{tmp}/node{n}", "--serve-s", str(limit),
                       "--seed", str(args.seed), "--block-kib", str(block_kib)]
                if n == 0:
                    cmd += ["--write-blocks", str(blocks)]
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True, env=env)
                procs.append(proc)
                lines: queue.Queue[str] = queue.Queue()
                if proc.stdout is None:
                    raise RuntimeError("a node process without its stdout pipe")
                threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
                ready = _json_line(lines, deadline, f"node {n}")
                print(f"node {n} ready (epoch {ready['epoch']})"
                      + (f", wrote {blocks} blocks of {block_kib} KiB in memory and on SSD"
                         if n == 0 else ""))
            last = args.nodes - 1
            done = subprocess.run(
                [python, "-m", "flatcake.cli", "node", "--node-id", str(last), "--redis",
                 redis.url, "--root", f"{tmp}/node{last}", "--restore", str(blocks),
                 "--seed", str(args.seed), "--block-kib", str(block_kib)],
                capture_output=True, text=True, env=env,
                timeout=max(1.0, deadline - time.monotonic()))
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    found = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if not found:
        raise ValueError(f"node {last} printed no result:\n{done.stderr[-2000:]}")
    out = json.loads(found[-1])
    return _report(out, args.nodes - 1)


def _report(out: dict[str, Any], node: int) -> int:
    mem, ssd = out["remote_memory"], out["remote_ssd"]
    print(f"node {node} restored node 0's blocks:")
    print(f"  {'path':<28} {'GB/s':>7}  check")
    for name, r in (("remote memory (NIXL READ)", mem), ("remote SSD (owner-staged)", ssd)):
        check = "byte-exact, CRC ok" if r["ok"] else r.get("miss", f"{r['bad_blocks']} bad")
        print(f"  {name:<28} {r.get('gb_s', 0.0):7.2f}  {check}")
    print(f"  {'local memory copy':<28} {out['local_memory']:7.2f}")
    print(f"  {'local SSD read':<28} {out['local_ssd']:7.2f}")
    if mem["ok"]:
        print(f"remote memory / local memory copy: {mem['gb_s'] / out['local_memory']:.0%} "
              "(bar: >= 50%)")
    ok = bool(mem["ok"] and ssd["ok"])
    print("OK: every block byte-exact" if ok else "FAILED: see above")
    return 0 if ok else 1
