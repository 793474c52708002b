"""Package exports that resolve on first use (PEP 562), for the ``__init__``s of the
packages whose modules load heavy or optional dependencies: importing ``flatcake.cio``
(torch) or ``flatcake.connectors`` (vLLM, SGLang, torch) does not import its submodules
until a name is used. Packages without such imports re-export plainly."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: ``name`` from ``package.where[name]``."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{where[name]}"), name)

    return __getattr__
