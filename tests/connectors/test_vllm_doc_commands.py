"""Every vLLM command line of the README and the docs pages parses with vLLM's own
argument parser (the engine virtualenv's), so a flag renamed upstream or a broken
``--kv-transfer-config`` is found before a user types it. ``vllm serve MODEL ...`` and
``python -m vllm.entrypoints.openai.api_server ...`` lines are both checked; nothing is
started."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (see scripts/engine_venv.sh)")

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
_FENCED = re.compile(r"^```\w*\n(.*?)^```", re.S | re.M)


def _commands(block: str) -> list[list[str]]:
    """The words of each shell command: continued lines and open quotes joined."""
    out, pending = [], ""
    for line in re.sub(r"\\\n", " ", block).splitlines():
        pending += line + "\n"
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        out.append(words)
        pending = ""
    return out


def vllm_commands() -> list[tuple[str, list[str]]]:
    """(page, vLLM's arguments) of every vLLM server command in a fenced block."""
    out = []
    for page in PAGES:
        for block in _FENCED.findall(page.read_text()):
            for words in _commands(block):
                if "vllm.entrypoints.openai.api_server" in words:
                    args = words[words.index("vllm.entrypoints.openai.api_server") + 1:]
                elif words[:2] == ["vllm", "serve"]:
                    args = ["--model", *words[2:]]
                else:
                    continue
                out.append((str(page.relative_to(REPO)), args))
    return out


def test_the_docs_show_vllm_commands() -> None:
    pages = {page for page, _ in vllm_commands()}
    assert {"README.md", "docs/integrations/vllm.md"} <= pages


@pytest.mark.parametrize(("page", "args"), vllm_commands(), ids=lambda x: str(x)[:40])
def test_vllm_command_parses(page: str, args: list[str]) -> None:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(args)
    config = parsed.kv_transfer_config
    assert config is not None, f"{page}: {args[:3]}... has no --kv-transfer-config"
    assert config.kv_connector == "FlatCakeConnector", page
    assert config.kv_connector_module_path == "flatcake.connectors.vllm", page
