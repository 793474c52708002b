"""Stand-ins SGLang needs to import on a CPU-only machine.

SGLang imports ``torchvision`` unconditionally (its multimodal helpers), and PyPI's
``torchvision`` is a CUDA build that fails to import beside the CPU torch, so the SGLang
virtualenv has none. ``install_torchvision_stub`` puts an inert package in its place
before SGLang is imported: any name looked up in it is a placeholder class. The KV
cache modules the tests drive never call into it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any


class _Placeholder(type):
    """A placeholder class whose every attribute is another placeholder."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(name, (), {})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        placeholder = _Placeholder(name, (), {})
        setattr(self, name, placeholder)
        return placeholder


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds every ``torchvision`` module as a stub package."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".")[0] != "torchvision":
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0+flatcake-stub"
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install_torchvision_stub() -> None:
    """Stand in for ``torchvision`` unless a real one imports."""
    if "torchvision" in sys.modules:
        return
    if importlib.util.find_spec("torchvision") is not None:
        try:
            import torchvision  # noqa: F401
            return
        except Exception:  # a CUDA build beside CPU torch fails at import
            for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
                del sys.modules[name]
    sys.meta_path.insert(0, _StubFinder())
