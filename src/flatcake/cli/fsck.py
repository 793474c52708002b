"""``flatcake fsck ROOT``: verify every header and data checksum under a store root.

Exit status 0 when every file is clean, 1 when anything is damaged or quarantined."""

from __future__ import annotations

import argparse
import json

DESCRIPTION = ("Read every session file under a store root and verify every header and "
               "data checksum (the store may be serving meanwhile). Exit status 0 when "
               "everything is clean, 1 when anything is damaged or quarantined.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("root", help="store root directory")
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    from flatcake.store.inspect import fsck_root

    report = fsck_root(args.root)
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=True))
        return 0 if report.ok else 1
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
    return 0 if report.ok else 1
