"""The CLI reference of the docs site, generated from the real parser.

``scripts/docs_hooks.py`` puts ``markdown()`` where ``docs/cli.md`` says
``<!-- cli-reference -->`` each time the site is built, so the page lists exactly the
commands and flags ``flatcake`` parses (``build_parser``), with their help and defaults.
"""

from __future__ import annotations

import argparse
import functools

from flatcake.cli import COMMANDS, build_parser

WIDTH = 96  # help lines wrap here, whatever the terminal that builds the site


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse exposes its subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise ValueError("the flatcake parser has no subcommands")


def _help(parser: argparse.ArgumentParser) -> str:
    parser.formatter_class = functools.partial(argparse.HelpFormatter, width=WIDTH)
    return parser.format_help().rstrip()


def markdown() -> str:
    """Every command: a table of them, then each one's ``--help`` as the parser prints it."""
    parser = build_parser()
    commands = _subparsers(parser)
    lines = ["| command | what it does |", "|---|---|"]
    lines += [f"| [`flatcake {name}`](#flatcake-{name}) | {help_text} |"
              for name, (_, help_text) in COMMANDS.items()]
    lines += ["", "## `flatcake`", "", "```text", _help(parser), "```"]
    for name in COMMANDS:
        lines += ["", f"## `flatcake {name}`", "", "```text", _help(commands[name]), "```"]
    return "\n".join(lines) + "\n"
