"""The tests' own layout, read from their source (every import, also those inside
functions): what several test modules share lives in a package's ``helpers`` module or
``conftest.py``, never in a ``test_*.py`` module that another one imports. A test module
imported elsewhere runs its module-level code twice under two names, and its helpers
change with the scenarios around them."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file; ``from a import b``
    counts as ``a`` and as ``a.b`` (``b`` may be a module)."""
    module = _module_name(path, root)
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
            out.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
    return out


def imports_of_test_modules(root: Path) -> list[str]:
    """``module:line imports name`` for each import of a ``test_*`` module under ``root``
    (a file importing itself included: it is never needed)."""
    found: dict[tuple[str, int], str] = {}
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, root)
        for line, name in _imports(path, root):
            if any(part.startswith("test_") for part in name.split(".")):
                found.setdefault((module, line), f"{module}:{line} imports {name}")
    return [found[k] for k in sorted(found)]


def test_no_test_module_imports_another() -> None:
    found = imports_of_test_modules(TESTS)
    assert found == [], ("move what these share into the package's helpers.py or "
                         f"conftest.py: {found}")


def test_an_import_of_a_test_module_is_found(tmp_path: Path) -> None:
    root = tmp_path / "tests"
    (root / "store").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "store" / "__init__.py").write_text("")
    (root / "store" / "helpers.py").write_text("def kv(): ...\n")
    (root / "store" / "test_a.py").write_text(
        "from tests.store.helpers import kv\nfrom .helpers import kv as kv2\n")
    assert imports_of_test_modules(root) == []
    (root / "store" / "test_b.py").write_text(
        "from tests.store.test_a import kv\n"
        "def test_x():\n    from . import test_a\n"
        "import tests.store.test_a\n")
    assert imports_of_test_modules(root) == [
        "tests.store.test_b:1 imports tests.store.test_a",
        "tests.store.test_b:3 imports tests.store.test_a",
        "tests.store.test_b:4 imports tests.store.test_a",
    ]
