"""``flatcake node``: one node of a cluster (cluster index on Redis + NIXL agent).

The node joins the cluster index at ``--redis`` under ``--node-id`` (bits 59..48 of its
addresses), publishes its NIXL agent, optionally writes ``--write-blocks`` demo blocks in
memory and on SSD under ``--root`` (published once durable), prints one JSON line
``{"ready": ...}`` and serves peers (remote memory READs, staged remote SSD reads) for
``--serve-s`` seconds or until interrupted. With ``--restore N`` it instead restores N
demo blocks of each medium from whichever live node holds them, checks every block's
CRC32 and bytes, prints one JSON line with GB/s per path and the local figures, and
exits (non-zero when a block was missing or wrong). Needs NIXL (scripts/nixl_venv.sh).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys

DESCRIPTION = ("Run one cluster node (cluster index on Redis, NIXL agent): serve this "
               "node's blocks to peers, or restore another node's demo blocks and print GB/s "
               "per path.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node-id", type=int, default=None, help="node id in [0, 4095] (required)")
    p.add_argument("--redis", default="redis://127.0.0.1:6379/0",
                   help="Redis URL (default redis://127.0.0.1:6379/0)")
    p.add_argument("--root", default=None, help="this node's directory for its files "
                   "(required)")
    p.add_argument("--cluster", default="flatcake", help="cluster name (key prefix)")
    p.add_argument("--arena-mib", type=int, default=64, help="host arena served to peers")
    p.add_argument("--block-kib", type=int, default=256, help="demo block size")
    p.add_argument("--write-blocks", type=int, default=0, help="demo blocks to write")
    p.add_argument("--restore", type=int, default=0,
                   help="restore this many demo blocks from peers, then exit")
    p.add_argument("--seed", type=int, default=0, help="demo bytes and keys")
    p.add_argument("--tenant", default="", help="tenant salt of the demo keys")
    p.add_argument("--serve-s", type=float, default=600.0, help="serve this long, then exit")
    p.add_argument("--timeout-s", type=float, default=10.0, help="bound of one remote read")
    p.add_argument("--progress-thread", action="store_true",
                   help="a NIXL progress thread (needed to serve over UCX_TLS=tcp)")


def run(args: argparse.Namespace) -> int:
    from flatcake.cluster.node import ClusterNode

    if args.node_id is None or args.root is None:
        raise ValueError("--node-id and --root are required")
    if args.arena_mib <= 0 or args.block_kib <= 0 or args.serve_s <= 0:
        raise ValueError("--arena-mib, --block-kib and --serve-s must be positive")
    if args.write_blocks < 0 or args.restore < 0:
        raise ValueError("--write-blocks and --restore must not be negative")
    # SIGTERM (the demo stopping its nodes) leaves the cluster index on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    block = args.block_kib * 1024
    window = max(args.restore * block, block)
    node = ClusterNode(args.node_id, args.redis, args.root, arena_bytes=args.arena_mib << 20,
                       window_bytes=window, cluster=args.cluster,
                       progress_thread=args.progress_thread)
    try:
        if args.restore:
            out = node.restore(args.seed, args.restore, args.tenant, timeout_s=args.timeout_s)
            out.update(node.local_figures(args.restore, block))
            print(json.dumps(out), flush=True)
            return 0 if all(out[p]["ok"] for p in ("remote_memory", "remote_ssd")) else 1
        if args.write_blocks:
            node.write_blocks(args.seed, args.write_blocks, block, args.tenant)
        print(json.dumps({"ready": True, "node": args.node_id, "epoch": node.index.epoch}),
              flush=True)
        node.serve(args.serve_s)
        return 0
    finally:
        node.close()
