"""``flatcake`` command line.

Each subcommand lives in its own module under ``cli`` and exposes ``DESCRIPTION``,
``add_arguments(parser)`` and ``run(args) -> int``; the table below (name, module, one-line
help) is the only shared place. Start-up stays fast: ``flatcake --help`` imports no
subcommand module, and a command imports only its own module, which keeps its heavy
imports (torch, the store, the simulator) inside ``run``. ``tests/test_cli_startup.py``
checks that torch stays out of every command that does not move KV bytes. Long work
shows progress bars (``flatcake.progress``) only on a terminal and never with ``--json``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from flatcake import progress

COMMANDS: dict[str, tuple[str, str]] = {
    "analyze": ("flatcake.cli.analyze", "reuse statistics and placement advice for a trace"),
    "demo": ("flatcake.cli.demo", "store round trip on real files: write a session, "
             "restore it, verify every byte"),
    "bench": ("flatcake.cli.bench", "restore one session from every layout on a real disk"),
    "inspect": ("flatcake.cli.inspect", "sessions, segments, bytes per medium, watermarks"),
    "fsck": ("flatcake.cli.fsck", "verify every checksum; non-zero exit on damage"),
    "replay": ("flatcake.cli.replay", "simulate one system at one load on a trace"),
    "tune": ("flatcake.cli.tune", "search the placement thresholds by replay on your trace; "
             "prints the best [placement] as TOML"),
    "node": ("flatcake.cli.node", "one cluster node: Redis index + NIXL agent; serve peers "
             "or restore their blocks"),
    "serve": ("flatcake.cli.serve", "the node service: one store per machine, shared by "
              "every engine on it"),
    "sweep": ("flatcake.cli.sweep", "replay every system at every load; tables, plots, "
              "report.html"),
    "loadgen": ("flatcake.cli.loadgen", "drive a live OpenAI-compatible server with a "
                "session workload; TTFT and cached share"),
}


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word that is one), if any."""
    return next((a for a in argv if a in COMMANDS), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with ``argv``, only the command it names gets its arguments (and its
    module imported), every other command is listed by name and help only."""
    parser = argparse.ArgumentParser(
        prog="flatcake",
        description="FlatCake: a flat KV-cache store for LLM serving.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    wanted = set(COMMANDS) if argv is None else {_chosen(argv)}
    for name, (module_name, help_text) in COMMANDS.items():
        if name not in wanted:
            sub.add_parser(name, help=help_text)
            continue
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=help_text, description=module.DESCRIPTION)
        module.add_arguments(p)
        p.set_defaults(func=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        # Bars (rate, ETA) on stderr only for a person at a terminal; never with --json.
        with progress.shown(progress.on_terminal(getattr(args, "json", False))):
            return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, PermissionError, ConnectionError) as exc:
        print(f"flatcake {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"flatcake {args.command}: interrupted", file=sys.stderr)
        return 130
