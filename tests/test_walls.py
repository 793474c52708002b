"""The walls between packages, read from the source (every import, also those inside
functions): the books (``control``) and the plans (``plan``) stay pure, the books stand
on the leaves alone (so the plans import the books, never the other way), the replay
models devices instead of doing I/O, engines stay inside their connectors, Redis and NIXL
stay behind the cluster index and the remote readers, the product never imports the
evaluation (replay, reports, bench, load generator, tuner, traces), nothing reaches into
the CLI or the connectors from outside, no two packages import each other, even through others, no
module of the replay imports itself back and its floors stand one on the other, and no
host reaches into a control plane's parts (it asks the query methods)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import flatcake

SRC = Path(flatcake.__file__).parent

PURE = ("flatcake.control", "flatcake.plan")
NOT_FROM_PURE = ("torch", "flatcake.cio", "flatcake.store", "flatcake.connectors",
                 "flatcake.replay", "flatcake.cluster")
# What the books may import besides themselves: the leaves, modules of plain values and
# arithmetic that import no other part of FlatCake.
LEAVES = ("flatcake.clock", "flatcake.config", "flatcake.errors", "flatcake.geometry",
          "flatcake.layout", "flatcake.readplan")
NOT_FROM_REPLAY = ("torch", "flatcake.cio", "flatcake.store", "flatcake.cluster")
# Transports stay behind one module each: Redis metadata in the cluster index, NIXL bytes
# in the remote readers.
TRANSPORTS = {"redis": ("flatcake.cluster",), "nixl": ("flatcake.cio.remote",)}
ENGINES = ("vllm", "sglang")
# The evaluation: the replay, the reports, the bench, the load generator, the tuner, the
# trace readers and the docs-page writer. The product (the books, the plans, the I/O, the
# hosts, the service, the cluster, the configuration and the leaves) never imports them,
# so research code can change without touching a serving engine's path; the CLI and the
# package face stand above both.
EVALUATION = ("flatcake.replay", "flatcake.report", "flatcake.bench", "flatcake.loadgen",
              "flatcake.tune", "flatcake.traces", "flatcake.docsout")
ABOVE_BOTH = ("flatcake.cli",)
PRIVATE = ("flatcake.cli", "flatcake.connectors")  # only from inside themselves, but:
# the node service hosts the connectors' engine-neutral scheduler halves, one per engine;
# the bench times their calls (``flatcake bench --node``, ``--connector``,
# ``--node-load``).
ALSO_FROM = {"flatcake.connectors": ("flatcake.service", "flatcake.bench.node",
                                     "flatcake.bench.connector", "flatcake.bench.node_load")}


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
        elif (_within(module, ("flatcake.control",)) and name.startswith("flatcake.")
              and not _within(name, ("flatcake.control", *LEAVES))):
            walls.append("the books import only themselves and the leaves")
        if _within(module, ("flatcake.replay",)) and _within(name, NOT_FROM_REPLAY):
            walls.append("the replay models devices, it does no I/O")
        if (_within(name, EVALUATION) and module != "flatcake"
                and not _within(module, (*EVALUATION, *ABOVE_BOTH))):
            walls.append("the product never imports the evaluation")
        if _within(name, ENGINES) and not _within(module, ("flatcake.connectors",)):
            walls.append("engines are imported by their connectors only")
        for transport, owners in TRANSPORTS.items():
            if _within(name, (transport,)) and not _within(module, owners):
                walls.append(f"{transport} is imported by {', '.join(owners)} only")
        private = _within(name, PRIVATE)
        if private and not _within(module, (private, *ALSO_FROM.get(private, ()))):
            walls.append(f"nothing outside {private} imports it")
        for wall in walls:
            found.setdefault((line, wall), f"{module}:{line} imports {name} ({wall})")
    return list(found.values())


def test_every_module_keeps_the_walls() -> None:
    found = [v for path in sorted(SRC.rglob("*.py")) for v in violations(path)]
    assert found == []


def package_graph() -> dict[str, dict[str, str]]:
    """Package (``control``, ``plan``, a top-level module such as ``layout``) -> the
    packages it imports -> the first import doing so, as ``module:line``. The package
    face ``flatcake/__init__.py`` is left out: it stands above them all."""
    graph: dict[str, dict[str, str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        module = _module_name(path)
        if module == "flatcake":
            continue
        source = module.split(".")[1]
        edges = graph.setdefault(source, {})
        for line, name in _imports(path):
            parts = name.split(".")
            if parts[0] != "flatcake" or len(parts) < 2 or parts[1] == source:
                continue
            if (SRC / parts[1]).is_dir() or (SRC / f"{parts[1]}.py").is_file():
                edges.setdefault(parts[1], f"{module}:{line}")
    return graph


def package_cycles(graph: dict[str, dict[str, str]]) -> list[str]:
    """Each ring of packages that import each other (directly or through others), with
    the imports that close it; empty when the packages form floors."""
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            p = todo.pop()
            if p not in seen:
                seen.add(p)
                todo.extend(graph.get(p, ()))
        reach[start] = seen
    rings = sorted({tuple(sorted(q for q in reach[p] if p in reach.get(q, ())))
                    for p in graph if p in reach[p]})
    return [", ".join(f"{a} -> {b} ({graph[a][b]})" for a in ring for b in ring
                      if b in graph.get(a, {}))
            for ring in rings]


def test_no_two_packages_import_each_other() -> None:
    assert package_cycles(package_graph()) == []



# The replay's floors: a module in the first may import (inside ``replay``) only its own
# floor and those named beside it; the modules above them (presets, simulate, cluster,
# results, sweep, plots, page) stand on them all.
REPLAY_FLOORS = {"workload": (), "node": ("workload",), "systems": ("node", "workload")}


def _resolve(name: str) -> str | None:
    """The module of ``SRC``'s tree that an imported name is, or is inside."""
    parts = name.split(".")
    while len(parts) > 1:
        path = SRC.parent.joinpath(*parts)
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            return ".".join(parts)
        parts.pop()
    return None


def module_graph(package: str) -> dict[str, dict[str, str]]:
    """Module of ``package`` -> the modules of ``package`` it imports (every import,
    also inside functions and under TYPE_CHECKING) -> the first import doing so."""
    graph: dict[str, dict[str, str]] = {}
    root = SRC.parent.joinpath(*package.split("."))
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path)
        edges = graph.setdefault(module, {})
        for line, name in _imports(path):
            target = _resolve(name) if _within(name, (package,)) else None
            if target is not None and target != module:
                edges.setdefault(target, f"{module}:{line}")
    return graph


def floor_violations(package: str, floors: dict[str, tuple[str, ...]]) -> list[str]:
    """Imports from a floor of ``package`` into a floor it does not stand on."""
    def floor(module: str) -> str:
        return module.removeprefix(package + ".").split(".")[0]
    out = []
    for module, edges in module_graph(package).items():
        if floor(module) not in floors:
            continue
        allowed = (floor(module), *floors[floor(module)])
        out += [f"{where} imports {target}" for target, where in edges.items()
                if floor(target) not in allowed]
    return out


def test_the_replay_has_no_import_circle_and_keeps_its_floors() -> None:
    assert package_cycles(module_graph("flatcake.replay")) == []
    assert floor_violations("flatcake.replay", REPLAY_FLOORS) == []


def test_a_circle_or_a_floor_broken_in_the_replay_is_found(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "flatcake"
    for where, source in [
            ("replay/node/a.py", "from flatcake.replay.workload.w import X\n"),
            ("replay/node/b.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                 "    from flatcake.replay.node.a import Y\n"),
            ("replay/node/c.py", "def f():\n    from flatcake.replay.node import b\n"),
            ("replay/node/__init__.py", ""),
            ("replay/workload/w.py", "from flatcake.replay.node.c import Z\n")]:
        (root / where).parent.mkdir(parents=True, exist_ok=True)
        (root / where).write_text(source)
    monkeypatch.setattr(__import__(__name__, fromlist=["SRC"]), "SRC", root)
    assert package_cycles(module_graph("flatcake.replay")) == [
        "flatcake.replay.node.a -> flatcake.replay.workload.w (flatcake.replay.node.a:1), "
        "flatcake.replay.node.b -> flatcake.replay.node.a (flatcake.replay.node.b:3), "
        "flatcake.replay.node.c -> flatcake.replay.node.b (flatcake.replay.node.c:2), "
        "flatcake.replay.workload.w -> flatcake.replay.node.c (flatcake.replay.workload.w:1)"]
    assert floor_violations("flatcake.replay", REPLAY_FLOORS) == [
        "flatcake.replay.workload.w:1 imports flatcake.replay.node.c"]

def test_a_ring_of_packages_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "flatcake"
    for where, source in [("control/a.py", "from flatcake.layout import ALIGN\n"),
                          ("layout.py", "def f():\n    from flatcake.plan import b\n"),
                          ("plan/b.py", "from flatcake.control import a\n"),
                          ("cio/c.py", "from flatcake.plan import b\n")]:
        (root / where).parent.mkdir(parents=True, exist_ok=True)
        (root / where).write_text(source)
    monkeypatch.setattr(__import__(__name__, fromlist=["SRC"]), "SRC", root)
    assert package_cycles(package_graph()) == [
        "control -> layout (flatcake.control.a:1), layout -> plan (flatcake.layout:2), "
        "plan -> control (flatcake.plan.b:1)"]


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
    ("control/x.py", "from flatcake.plan.reads import plan_reads\n", "leaves"),
    ("control/x.py", "if TYPE_CHECKING:\n    from flatcake.plan import ReadPlan\n", "leaves"),
    ("control/x.py", "from flatcake import progress\n", "leaves"),
    ("store/x.py", "import redis\n", "redis is imported"),
    ("cio/readers.py", "from nixl._api import nixl_agent\n", "nixl is imported"),
    ("connectors/x.py", "def f():\n    from flatcake.bench.source import make_kv\n",
     "the evaluation"),
    ("service/x.py", "from flatcake import docsout\n", "the evaluation"),
    ("store/x.py", "from flatcake.tune import tune\n", "the evaluation"),
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
    ("plan/x.py", "from flatcake.control.index import HitRun\nfrom flatcake.layout import ALIGN\n"),
    ("control/x.py", "from flatcake import errors\nfrom flatcake.geometry import KVGeometry\n"
                     "from flatcake.readplan import ReadPlan\nfrom .index import Segment\n"),
    ("cluster/index.py", "import redis\n"),
    ("cio/remote.py", "from nixl._api import nixl_agent\n"),
    ("bench/x.py", "from flatcake.replay.presets import X\nfrom flatcake.docsout import Y\n"),
    ("cli/x.py", "from flatcake.loadgen import run\n"),
])
def test_allowed_imports_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              where: str, source: str) -> None:
    root = tmp_path / "flatcake"
    path = root / where
    path.parent.mkdir(parents=True)
    path.write_text(source)
    monkeypatch.setattr(__import__(__name__, fromlist=["SRC"]), "SRC", root)
    assert violations(path) == []


# A host asks the control plane through its query methods, never through its parts:
# these attributes (and every private one) of a control plane stay for ``flatcake.control``.
CONTROL_PARTS = frozenset({"index", "arena", "ssd", "copies", "scheduler"})
# What a control plane is called in a host: a name, an attribute of something, or
# ``x.books()``.
PLANE_NAMES = frozenset({"control", "cp", "_control", "books"})
PLANE_ATTRS = frozenset({"control", "cp", "_control"})


def _is_plane(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in PLANE_NAMES
    if isinstance(node, ast.Attribute):
        # ``flatcake.control.index`` names a module, not a part.
        root: ast.expr = node
        while isinstance(root, ast.Attribute):
            root = root.value
        return node.attr in PLANE_ATTRS and not (isinstance(root, ast.Name)
                                                 and root.id == "flatcake")
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "books")


def part_reaches(path: Path) -> list[str]:
    """Where a module outside ``flatcake.control`` reads a part (or a private field) of
    a control plane, one line each."""
    module = _module_name(path)
    if _within(module, ("flatcake.control",)):
        return []
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and _is_plane(node.value) and (
                node.attr in CONTROL_PARTS
                or (node.attr.startswith("_") and not node.attr.startswith("__"))):
            found.append(f"{module}:{node.lineno} reads {ast.unparse(node)} (a part of the "
                         f"control plane: ask a query method)")
    return found


def test_no_host_reaches_into_the_control_plane() -> None:
    found = [v for path in sorted(SRC.rglob("*.py")) for v in part_reaches(path)]
    assert found == []


@pytest.mark.parametrize("source", [
    "def f(self):\n    self.control.scheduler.submit(1)\n",
    "def f(peer):\n    return peer.cp.index\n",
    "def f(control, s):\n    return control.ssd.files_of(s)\n",
    "def f(self):\n    return len(self._control.copies)\n",
    "def f(node):\n    return node.books().arena.used_bytes\n",
    "def f(cp):\n    return cp._sessions\n",
    "def f(self):\n    return self._control._reclaimer.take_reclaim_actions()\n",
])
def test_a_reach_into_the_control_plane_is_found(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 source: str) -> None:
    path = tmp_path / "flatcake" / "store" / "x.py"
    path.parent.mkdir(parents=True)
    path.write_text(source)
    monkeypatch.setattr(__import__(__name__, fromlist=["SRC"]), "SRC", tmp_path / "flatcake")
    (found,) = part_reaches(path)
    assert "flatcake.store.x:2 reads" in found


@pytest.mark.parametrize(("where", "source"), [
    ("store/x.py", "def f(self, keys):\n    return self.control.lookup(keys).num_blocks\n"),
    ("replay/x.py", "def f(cp):\n    return cp.segment(3), cp.stats().num_keys\n"),
    ("cio/x.py", "import flatcake.control.index\nX = flatcake.control.index.Segment\n"),
    ("store/x.py", "def f(self):\n    return self.index.lookup(()), self.control.__class__\n"),
    ("control/x.py", "def f(control):\n    return control.index\n"),
])
def test_asking_the_control_plane_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         where: str, source: str) -> None:
    path = tmp_path / "flatcake" / where
    path.parent.mkdir(parents=True)
    path.write_text(source)
    monkeypatch.setattr(__import__(__name__, fromlist=["SRC"]), "SRC", tmp_path / "flatcake")
    assert part_reaches(path) == []
