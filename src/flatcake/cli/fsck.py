"""``flatcake fsck ROOT [--repair] [--json]``: verify every header and data checksum
under a store root and tell damage the store has already settled from damage it has
not (``store.inspect`` defines both); ``--repair`` first settles the root as a restart
would (``store.recovery``).

It also lists what the store settled earlier (``ROOT/damage.log``: every file it cut,
deleted or quarantined for damage, when and why), since a cut file looks clean.

Exit status 0 when nothing is left to settle (every live file clean; quarantined files
are settled damage, listed and kept for inspection), 1 when a live file still holds
damage (``--repair`` or a restart settles it), 2 when ROOT is not a store, or (with
``--repair``) a store is serving it. ``--json`` prints the same verdicts as the text.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flatcake.store.inspect import FsckReport
    from flatcake.store.recovery import RepairReport

DESCRIPTION = ("Read every session file under a store root, verify every header and "
               "data checksum (the store may be serving meanwhile), and tell damage the "
               "store has settled (files it quarantined; files it cut look clean) from "
               "damage it has not, and list what the store settled earlier (ROOT/damage.log: "
               "every file it cut, deleted or quarantined, when and why). "
               "Exit status 0 when nothing is left to settle, 1 when "
               "a live file still holds damage, 2 when ROOT is not a store. With "
               "--repair, first do what a restart would: cut damaged files after their "
               "last valid segment, delete empty ones, quarantine unreadable or stray "
               "ones (refused while a store serves the root).")

_ACTIONS = {"quarantine": "--repair moves it to quarantine/",
            "cut": "--repair cuts the file after its last valid segment",
            "delete": "--repair deletes the file (no valid segment before the damage)"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("root", help="store root directory")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--repair", action="store_true",
                   help="settle damage as a restart would, then verify")


def _repair_json(repair: RepairReport) -> dict[str, Any]:
    return {k: getattr(repair, k) for k in (
        "num_files", "quarantined", "cut", "deleted", "damaged_segments", "lost_segments")} | {
        k: list(getattr(repair, k)) for k in ("quarantined_paths", "cut_paths",
                                              "deleted_paths")}


def _print_repair(repair: RepairReport) -> None:
    print(f"repaired {repair.num_files} files: {repair.cut} cut after their last valid "
          f"segment ({repair.damaged_segments} damaged segments, {repair.lost_segments} "
          f"valid ones past them), {repair.deleted} deleted, {repair.quarantined} "
          f"quarantined")
    for verb, paths in (("cut", repair.cut_paths), ("deleted", repair.deleted_paths),
                        ("quarantined", repair.quarantined_paths)):
        for path in paths:
            print(f"  {verb:11s} {path}")


def _print_report(report: FsckReport) -> None:
    for f in report.files:
        if f.state == "ok":
            print(f"ok       {f.path}: {f.num_segments} segments, {f.num_blocks} blocks")
        elif f.state == "settled":
            print(f"settled  {f.path}: quarantined ({f.problem}); out of service, never "
                  f"read again, kept for inspection")
        else:
            print(f"DAMAGED  {f.path}: {f.problem}; not settled: {_ACTIONS[f.action]}")
    print(f"{len(report.files)} files: {report.num_ok} ok, {report.num_settled} settled "
          f"(quarantined), {report.num_damaged} damaged and not settled")
    if report.num_damaged:
        print(f"{report.num_damaged} files still hold damage: run flatcake fsck --repair "
              f"{report.root} (refused while a store serves it; a restart of the store "
              f"settles them too)")
    elif report.num_settled:
        print("nothing left to settle; quarantined files may be deleted once inspected")


def _print_history(history: list[dict[str, Any]], shown: int = 20) -> None:
    import time

    if not history:
        return
    print(f"settled earlier ({len(history)} in damage.log, newest last):")
    for e in history[-shown:]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(e.get("time", 0))))
        at = f" at byte {e['end_bytes']}" if "end_bytes" in e else ""
        print(f"  {when}  {e.get('action', '?'):10s} {e.get('file', '?')}{at}: "
              f"{e.get('why', '')}")
    if len(history) > shown:
        print(f"  ... {len(history) - shown} older entries: flatcake fsck --json lists all")


def run(args: argparse.Namespace) -> int:
    from flatcake.cio.names import read_damage_log
    from flatcake.store.inspect import fsck_root

    repair = None
    if args.repair:  # opens files for writing: needs torch, which a plain fsck does not
        from flatcake.store.recovery import repair_root

        repair = repair_root(args.root)
    report = fsck_root(args.root)
    history = read_damage_log(args.root)
    if args.json:
        out = report.to_json() | {"settled_earlier": history}
        if repair is not None:
            out["repair"] = _repair_json(repair)
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        if repair is not None:
            _print_repair(repair)
        _print_history(history)
        _print_report(report)
    return 0 if report.ok else 1
