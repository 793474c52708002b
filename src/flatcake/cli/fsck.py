"""``flatcake fsck ROOT [--repair]``: verify every header and data checksum under a store
root; ``--repair`` first settles the root as a restart would (``store.recovery``).

Exit status 0 when every file is clean, 1 when anything is damaged or quarantined (with
``--repair``: when a live file is still damaged; quarantined files are kept for
inspection and listed), 2 when ROOT is not a store or a store is serving it (repair)."""

from __future__ import annotations

import argparse
import json

DESCRIPTION = ("Read every session file under a store root and verify every header and "
               "data checksum (the store may be serving meanwhile). Exit status 0 when "
               "everything is clean, 1 when anything is damaged or quarantined. With "
               "--repair, first do what a restart would: cut damaged files after their "
               "last valid segment, delete empty ones, quarantine unreadable or stray "
               "ones (refused while a store serves the root).")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("root", help="store root directory")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--repair", action="store_true",
                   help="settle damage as a restart would, then verify")


def run(args: argparse.Namespace) -> int:
    from flatcake.store.inspect import fsck_root

    repair = None
    if args.repair:  # opens files for writing: needs torch, which a plain fsck does not
        from flatcake.store.recovery import repair_root

        repair = repair_root(args.root)
    report = fsck_root(args.root)
    ok = report.ok if repair is None else all(f.ok for f in report.files
                                              if not f.quarantined)
    if args.json:
        out = report.to_json()
        if repair is not None:
            out["repair"] = {k: getattr(repair, k) for k in (
                "quarantined", "cut", "deleted", "damaged_segments", "lost_segments")}
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0 if ok else 1
    if repair is not None:
        print(f"repaired {repair.num_files} files: {repair.cut} cut after their last valid "
              f"segment ({repair.damaged_segments} damaged segments, {repair.lost_segments} "
              f"valid ones past them), {repair.deleted} deleted, {repair.quarantined} "
              f"quarantined")
    for f in report.files:
        where = " (quarantined)" if f.quarantined else ""
        if f.ok:
            print(f"ok       {f.path}: {f.num_segments} segments, {f.num_blocks} blocks")
        elif f.error:
            print(f"DAMAGED  {f.path}{where}: file header: {f.error}")
        else:
            for d in f.damaged:
                print(f"DAMAGED  {f.path}{where}: segment at offset {d.file_offset}: "
                      f"{d.reason} ({f.num_segments} segments before it are valid)")
            if not f.damaged:
                print(f"DAMAGED  {f.path}{where}: pulled out of service by the store")
    print(f"{len(report.files)} files, {report.num_damaged} damaged")
    return 0 if ok else 1
