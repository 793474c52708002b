"""A session's SSD bytes with and without releasing older turns' window rows.

Usage: ``python scripts/window_bytes.py DIR [--model deepseek-v4-flash] [--turns 16]
[--blocks 8]``. Stores one session of ``--turns`` turns of ``--blocks`` new blocks each
(random bytes, real O_DIRECT files under ``DIR``) twice in one run, with
``store.release_old_windows`` on and off, and prints per run: the session file's
length, what it takes on disk (``st_blocks``), each layer kind's bytes held and
released (``flatcake inspect``), the bound of the sliding-window kinds (one window per
layer), and the CPU seconds of the run. Each run then restores the whole session and
checks every full-attention block and the last window byte for byte.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from flatcake.config import load_config
from flatcake.control.keys import chain_block_keys
from flatcake.geometry import preset
from flatcake.store import FlatCakeStore, TurnSignals
from flatcake.store.inspect import inspect_root


def run(root: Path, model: str, turns: int, blocks: int, release: bool) -> dict[str, int]:
    g = preset(model)
    total = turns * blocks
    gen = torch.Generator().manual_seed(1)
    src = [torch.randint(0, 256, (total, size), dtype=torch.uint8, generator=gen)
           for size in g.layer_block_bytes]
    keys = chain_block_keys(list(range(total * g.tokens_per_block)), g.tokens_per_block,
                            "window-bytes")
    cfg = load_config(env={}, overrides=[
        f"store.release_old_windows={str(release).lower()}",
        "placement.memory_copy_watermark=0", "store.memory_capacity_bytes=0"])
    cpu0 = time.process_time()
    with FlatCakeStore.open(root, g, cfg) as store:
        for t in range(turns):
            n = (t + 1) * blocks
            res = store.store_turn("s", keys[:n], src, range(n), TurnSignals(t, 0))
            if res.medium is None or res.medium.name != "SSD":
                sys.exit(f"turn {t} was not stored on SSD: {res}")
        dst = [torch.zeros_like(t) for t in src]
        res = store.load(keys, dst, range(total))
        if res.num_blocks != total or res.damaged_segments:
            sys.exit(f"restore: {res}")
        for layer, w in enumerate(g.layer_window_blocks or (0,) * g.num_layers):
            lo = total - w if w else 0
            if not torch.equal(dst[layer][lo:], src[layer][lo:]):
                sys.exit(f"layer {layer}: restored bytes differ")
    cpu = time.process_time() - cpu0
    (path,) = (root / "sessions").iterdir()
    st = os.stat(path)
    out = {"file length": st.st_size, "allocated (st_blocks)": st.st_blocks * 512}
    for kind in inspect_root(root)["layer_kinds"]:
        out[f"{kind['kind']} held"] = kind["stored_bytes"]
        out[f"{kind['kind']} released"] = kind["released_bytes"]
    out["restore useful bytes"] = res.useful_bytes
    out["CPU ms"] = round(cpu * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path, help="scratch folder (two stores are made in it)")
    ap.add_argument("--model", default="deepseek-v4-flash")
    ap.add_argument("--turns", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=8, help="new blocks per turn")
    args = ap.parse_args()
    if not args.dir.is_dir():
        sys.exit(f"{args.dir} is not a folder")
    rows: dict[bool, dict[str, int]] = {}
    for release in (True, False):
        root = args.dir / f"window-bytes-{'on' if release else 'off'}"
        shutil.rmtree(root, ignore_errors=True)
        try:
            rows[release] = run(root, args.model, args.turns, args.blocks, release)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    g = preset(args.model)
    bound = sum(b * w for b, w in zip(g.layer_block_bytes, g.layer_window_blocks or (),
                                      strict=False))
    print(f"{args.model}: {args.turns} turns x {args.blocks} blocks; one window of the "
          f"sliding layers is {bound} B")
    print("| | release on | release off | on / off |\n|---|---|---|---|")
    for name in rows[True]:
        on, off = rows[True][name], rows[False][name]
        print(f"| {name} | {on} | {off} | {on / off:.3f} |" if off else
              f"| {name} | {on} | {off} | |")
    print(f"load average: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
