"""``flatcake inspect ROOT``: what a store root holds (sessions, segments, bytes per
medium, watermarks), from the session file headers; ``--json`` for machines. Live files
whose headers show damage are listed apart from the quarantined ones the store already
settled (``store.inspect``); segment data crcs are ``flatcake fsck``'s."""

from __future__ import annotations

import argparse
import json

DESCRIPTION = ("What a store root holds, from its session file headers: sessions, "
               "segments, bytes per medium against the budgets, reclaim watermarks.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("root", help="store root directory")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--config", default=None,
                   help="TOML config file to compare against (default: the config the "
                        "store recorded in ROOT/config.json when it last opened)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="config override, repeatable (also replaces the store's record)")


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def run(args: argparse.Namespace) -> int:
    from flatcake.config import load_config
    from flatcake.progress import size_text
    from flatcake.store.inspect import inspect_root

    given = load_config(args.config, overrides=args.set) if args.config or args.set else None
    report = inspect_root(args.root, given)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0
    print(f"store {report['root']}")
    print(f"  config: {report['config_source']}")
    g, pl = report["geometry"], report["config"]["placement"]
    if g is not None:
        print(f"  geometry: {g['name']}, {g['num_layers']} layers, {g['tokens_per_block']} "
              f"tokens per block; io_mode {report['io_mode']}")
        for grp in g.get("groups", ()):
            window = f", window {grp['window_tokens']} tokens" if grp["window_tokens"] else ""
            print(f"    {grp['num_layers']} {grp['kind']} layers: {grp['entry_bytes']} B "
                  f"per {grp['tokens_per_entry']} tokens{window}")
        for kind in report["layer_kinds"]:
            saved, released = kind["saved_bytes"], kind.get("released_bytes", 0)
            notes = ([f"{size_text(saved)} saved: only the window is stored"]
                     if saved else []) + \
                ([f"{size_text(released)} released: older turns' windows"]
                 if released else [])
            print(f"    {kind['kind']} layers on SSD: {size_text(kind['stored_bytes'])}"
                  + (f" ({'; '.join(notes)})" if notes else ""))
    print(f"  {report['host_buffers']}")
    print(f"  placement thresholds (tokens): agent context "
          f"{pl['agent_context_threshold_tokens']}, long reply "
          f"{pl['long_reply_threshold_tokens']}, short reply "
          f"{pl['short_reply_threshold_tokens']}")
    for medium, m in report["media"].items():
        cap = m["capacity_bytes"]
        share = m["used_bytes"] / cap if cap else 0.0
        print(f"  {medium:6s} used {_mib(m['used_bytes'])} of {_mib(cap)} ({share:.1%}); "
              f"reclaim above {m['high']:.0%} down to {m['low']:.0%}")
    ssd = report["media"]["ssd"]
    print(f"  session files: {_mib(ssd['file_bytes_on_disk'])} long, "
          f"{_mib(ssd['file_bytes_allocated'])} allocated on disk")
    print(f"  {len(report['sessions'])} sessions")
    for s in report["sessions"]:
        print(f"    {s['session_id']!r}: {s['segments']} segments, {s['blocks']} blocks, "
              f"{_mib(s['ssd_bytes'])} in files {s['files']}")
    for path in report["damaged_files"]:
        print(f"  damaged, not settled: {path} (run flatcake fsck; --repair settles it)")
    for path in report["quarantined_files"]:
        print(f"  quarantined (settled, out of service): {path}")
    return 0
