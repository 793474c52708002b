"""``flatcake demo``: the store round trip on real files.

Writes a few turns of one session (a preset geometry, random KV bytes in a paged KV
tensor) into a store under a temporary directory, restores the whole prefix into a
second paged KV tensor through a shuffled block table, checks every byte, and prints
what happened: the placement rule of each turn, write and restore commands, bytes and
GB/s.
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import tempfile
import time
from pathlib import Path

from flatcake.geometry import PRESETS, KVGeometry, preset

# prev_reply_tokens per turn after the first: a chat-like short reply (memory), a long
# reply (SSD), a medium one (SSD by default), then again.
_REPLIES = (200, 3000, 1000)


DESCRIPTION = ("Write a few turns of one session (random KV bytes of a preset model) into "
               "a store on the disk at hand, restore the whole prefix into other slots, "
               "check every byte, and print each turn's placement rule, the read and write "
               "commands, bytes and GB/s. Takes a few seconds; the store lives in a "
               "temporary directory under . unless --root is given.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="llama-3.1-8b", choices=sorted(PRESETS),
                   help="geometry preset (default: llama-3.1-8b)")
    p.add_argument("--turns", type=int, default=4, help="turns to write (default 4)")
    p.add_argument("--first-tokens", type=int, default=2048,
                   help="tokens of the first turn's prompt (default 2048)")
    p.add_argument("--turn-tokens", type=int, default=512,
                   help="new tokens per later turn (default 512)")
    p.add_argument("--layers", type=int, default=0,
                   help="use only this many layers of the preset (0: all)")
    p.add_argument("--root", default=None,
                   help="store directory (default: a temporary directory, removed after)")
    p.add_argument("--config", default=None, help="TOML config file")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="config override, repeatable")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nodes", type=int, default=1,
                   help="with 2 or more: a cluster on this machine (Redis + NIXL), node 0 "
                        "writes, the last node restores (flatcake.cli.cluster_demo)")
    p.add_argument("--cluster-blocks", type=int, default=64,
                   help="with --nodes: blocks of 256 KiB per medium (default 64)")
    p.add_argument("--timeout-s", type=float, default=120.0,
                   help="with --nodes: the deadline of the whole cluster demo")


def _geometry(args: argparse.Namespace) -> KVGeometry:
    g = preset(args.model)
    if args.layers:
        if not 0 < args.layers <= g.num_layers:
            raise ValueError(f"--layers must be in [1, {g.num_layers}], got {args.layers}")
        g = KVGeometry(args.layers, g.tokens_per_block, g.num_kv_heads, g.head_dim, g.dtype,
                       g.mla_latent_dim, f"{g.name}[:{args.layers}]")
    return g


def _kv_shape(g: KVGeometry, num_slots: int) -> tuple[int, ...]:
    # (2, slots, block_size, kv_heads, head_dim) like FlashAttention; MLA: latents.
    if g.is_mla:
        return (num_slots, g.tokens_per_block, g.mla_latent_dim * g.dtype_bytes)
    return (2, num_slots, g.tokens_per_block, g.num_kv_heads, g.head_dim * g.dtype_bytes)


def _gb_s(num_bytes: int, seconds: float) -> str:
    return f"{num_bytes / seconds / 1e9:6.2f} GB/s" if seconds > 0 else "   n/a"


def run(args: argparse.Namespace) -> int:
    if args.nodes < 1:
        raise ValueError(f"--nodes must be >= 1 (2 or more for a cluster), got {args.nodes}")
    if args.nodes > 1:
        from flatcake.cli.cluster_demo import run_cluster

        return run_cluster(args)
    import numpy as np
    import torch

    from flatcake.config import load_config
    from flatcake.control.keys import chain_block_keys
    from flatcake.store import FlatCakeStore, TurnSignals

    for name in ("turns", "first_tokens", "turn_tokens"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0, got "
                             f"{getattr(args, name)}")
    g = _geometry(args)
    config = load_config(args.config, overrides=args.set)
    tokens = args.first_tokens + args.turn_tokens * (args.turns - 1)
    num_blocks = tokens // g.tokens_per_block
    rng = random.Random(args.seed)
    token_ids = [rng.randrange(128_000) for _ in range(tokens)]
    keys = chain_block_keys(token_ids, g.tokens_per_block, g.name)
    gen = np.random.default_rng(args.seed)
    shape = _kv_shape(g, num_blocks)
    src = [torch.frombuffer(bytearray(gen.bytes(math.prod(shape))), dtype=torch.uint8)
           .view(shape) for _ in range(g.num_layers)]
    src_slots = list(range(num_blocks))
    rng.shuffle(src_slots)

    # On the real disk by default (a tmpfs /tmp would measure memory, not I/O).
    tmp = None if args.root else tempfile.mkdtemp(prefix=".flatcake-demo-", dir=".")
    root = Path(args.root or tmp or ".")
    print(f"flatcake demo: {g.name}, {g.num_layers} layers, {g.block_bytes_per_layer} B per "
          f"block per layer, {args.turns} turns, {num_blocks} blocks "
          f"({num_blocks * g.block_bytes / 2**20:.1f} MiB of KV), store at {root}")
    try:
        with FlatCakeStore.open(root, g, config) as store:
            print(f"io_mode={store.io_mode} reader={store.reader.name}")
            done_tokens = 0
            for turn in range(args.turns):
                done_tokens += args.first_tokens if turn == 0 else args.turn_tokens
                n = done_tokens // g.tokens_per_block
                signals = TurnSignals(turn, done_tokens,
                                      None if turn == 0 else _REPLIES[(turn - 1) % 3])
                res = store.store_turn("demo-session", keys[:n], src, src_slots[:n], signals)
                medium = res.medium.name.lower() if res.medium is not None else "-"
                print(f"  turn {turn}: {res.num_blocks:5d} blocks -> {medium:6s} "
                      f"by {res.rule:12s} {res.bytes_written / 2**20:9.1f} MiB "
                      f"{res.write_calls:3d} writes {res.elapsed_s * 1e3:8.1f} ms "
                      f"{_gb_s(res.bytes_written, res.elapsed_s)}")
            dst = [torch.zeros_like(t) for t in src]
            dst_slots = list(range(num_blocks))
            rng.shuffle(dst_slots)
            t0 = time.perf_counter()
            handle = store.start_load(keys, dst, dst_slots)
            handle.wait_for_layer(0)
            first_layer_s = time.perf_counter() - t0
            res_load = handle.wait()
            ok = res_load.num_blocks == num_blocks and all(
                torch.equal(d[:, dst_slots] if not g.is_mla else d[dst_slots],
                            s[:, src_slots] if not g.is_mla else s[src_slots])
                for d, s in zip(dst, src, strict=True))
            print(f"restore: {res_load.num_blocks} of {num_blocks} blocks "
                  f"({res_load.num_ssd_blocks} ssd, {res_load.num_memory_blocks} memory), "
                  f"{res_load.commands} SSD reads (bound layers x ssd turns), "
                  f"{res_load.memory_copies} arena copies")
            print(f"  ssd: {res_load.bytes_read / 2**20:.1f} MiB read for "
                  f"{res_load.useful_bytes / 2**20:.1f} MiB wanted; memory: "
                  f"{res_load.memory_bytes / 2**20:.1f} MiB copied")
            print(f"  layer 0 ready after {first_layer_s * 1e3:.1f} ms, all "
                  f"{g.num_layers} layers after {res_load.elapsed_s * 1e3:.1f} ms: "
                  f"{_gb_s(res_load.useful_bytes + res_load.memory_bytes, res_load.elapsed_s)}"
                  f" restored")
            print(f"verify: {'bytes equal' if ok else 'MISMATCH'}")
            return 0 if ok else 1
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
