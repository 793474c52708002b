"""``flatcake demo``: placeholder main job until the store round trip lands."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the built-in demo")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print("flatcake: demo not implemented yet")
    return 0
