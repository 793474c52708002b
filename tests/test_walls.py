"""The walls between packages, read from the source (every import, also those inside
functions): the books (``control``) and the plans (``plan``) stay pure, the replay
models devices instead of doing I/O, engines stay inside their connectors, Redis and NIXL
stay behind the cluster index and the remote readers, and nothing
reaches into the CLI or the connectors from outside."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import flatcake

SRC = Path(flatcake.__file__).parent

PURE = ("flatcake.control", "flatcake.plan")
NOT_FROM_PURE = ("torch", "flatcake.cio", "flatcake.store", "flatcake.connectors",
                 "flatcake.replay", "flatcake.cluster")
NOT_FROM_REPLAY = ("torch", "flatcake.cio", "flatcake.store", "flatcake.cluster")
# Transports stay behind one module each: Redis metadata in the cluster index, NIXL bytes
# in the remote readers.
TRANSPORTS = {"redis": ("flatcake.cluster",), "nixl": ("flatcake.cio.remote",)}
ENGINES = ("vllm", "sglang")
PRIVATE = ("flatcake.cli", "flatcake.connectors")  # only from inside themselves


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out.append((node.lineno, base))
            # ``from flatcake import cli`` imports ``flatcake.cli``.
            out.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
    return out


def _within(name: str, packages: tuple[str, ...]) -> str | None:
    for p in packages:
        if name == p or name.startswith(p + "."):
            return p
    return None


def violations(path: Path) -> list[str]:
    """The walls ``path`` breaks, one line each (empty when it keeps them all)."""
    module = _module_name(path)
    found: dict[tuple[int, str], str] = {}  # (line, wall) -> the first import breaking it
    for line, name in _imports(path):
        walls = []
        if _within(module, PURE) and _within(name, NOT_FROM_PURE):
            walls.append("the books and plans stay pure")
        if _within(module, ("flatcake.replay",)) and _within(name, NOT_FROM_REPLAY):
            walls.append("the replay models devices, it does no I/O")
        if _within(name, ENGINES) and not _within(module, ("flatcake.connectors",)):
            walls.append("engines are imported by their connectors only")
        for transport, owners in TRANSPORTS.items():
            if _within(name, (transport,)) and not _within(module, owners):
                walls.append(f"{transport} is imported by {', '.join(owners)} only")
        private = _within(name, PRIVATE)
        if private and not _within(module, (private,)):
            walls.append(f"nothing outside {private} imports it")
        for wall in walls:
            found.setdefault((line, wall), f"{module}:{line} imports {name} ({wall})")
    return list(found.values())


def test_every_module_keeps_the_walls() -> None:
    found = [v for path in sorted(SRC.rglob("*.py")) for v in violations(path)]
    assert found == []


@pytest.mark.parametrize(("where", "source", "wall"), [
    ("control/x.py", "def f():\n    import torch\n", "pure"),
    ("plan/x.py", "from flatcake.cio.direct import aligned_buffer\n", "pure"),
    ("control/x.py", "from ..store import store\n", "pure"),
    ("replay/x.py", "import flatcake.store.store\n", "no I/O"),
    ("replay/systems/x.py", "from flatcake.cio import format\n", "no I/O"),
    ("store/x.py", "from vllm.config import VllmConfig\n", "engines"),
    ("bench/x.py", "import sglang\n", "engines"),
    ("store/x.py", "from flatcake import cli\n", "flatcake.cli"),
    ("replay/x.py", "from flatcake.connectors.settings import X\n", "flatcake.connectors"),
    ("control/x.py", "from flatcake.cluster import ClusterIndex\n", "pure"),
    ("store/x.py", "import redis\n", "redis is imported"),
    ("cio/readers.py", "from nixl._api import nixl_agent\n", "nixl is imported"),
])
def test_a_broken_wall_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                where: str, source: str, wall: str) -> None:
    root = tmp_path / "flatcake"
    path = root / where
    path.parent.mkdir(parents=True)
    path.write_text(source)
    monkeypatch.setattr(__import__(__name__, fromlist=["SRC"]), "SRC", root)
    (found,) = violations(path)
    assert wall in found


@pytest.mark.parametrize(("where", "source"), [
    ("connectors/x.py", "from flatcake.connectors.requests import RequestView\nimport vllm\n"),
    ("cli/x.py", "from flatcake.cli.replay import main\n"),
    ("replay/x.py", "from flatcake.control import ControlPlane\nimport numpy\n"),
    ("cluster/index.py", "import redis\n"),
    ("cio/remote.py", "from nixl._api import nixl_agent\n"),
])
def test_allowed_imports_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              where: str, source: str) -> None:
    root = tmp_path / "flatcake"
    path = root / where
    path.parent.mkdir(parents=True)
    path.write_text(source)
    monkeypatch.setattr(__import__(__name__, fromlist=["SRC"]), "SRC", root)
    assert violations(path) == []
