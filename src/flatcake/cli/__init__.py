"""``flatcake`` command line. Each subcommand lives in its own module under ``cli`` and
exposes ``register(subparsers)``; the module list below is the only shared place."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

COMMAND_MODULES: tuple[str, ...] = (
    "flatcake.cli.analyze",
    "flatcake.cli.demo",
    "flatcake.cli.bench",
    "flatcake.cli.inspect",
    "flatcake.cli.fsck",
    "flatcake.cli.replay",
    "flatcake.cli.sweep",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flatcake",
        description="FlatCake: a flat KV-cache store for LLM serving.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, PermissionError) as exc:
        print(f"flatcake {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
