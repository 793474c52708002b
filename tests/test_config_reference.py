"""The configuration page is generated from the schema when the site is built: every
key, under the section a user sets it in, with its type, its default and the string
documenting its field."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from flatcake.config import SECTIONS, FlatCakeConfig, keys
from flatcake.config_reference import docs, markdown, schema

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "usage" / "configuration.md"


def _built_page() -> str:
    """The page as ``mkdocs build`` renders its markdown (``scripts/docs_hooks.py``)."""
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "scripts" /
                                                  "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = SimpleNamespace(file=SimpleNamespace(abs_src_path=str(PAGE)))
    return str(hooks.on_page_markdown(PAGE.read_text(), page, None, None))


def test_the_built_page_lists_every_key_with_section_type_and_default() -> None:
    built = _built_page()
    assert "<!-- config-reference -->" not in built and markdown() in built
    sections = re.split(r"^## ", built, flags=re.M)
    defaults = FlatCakeConfig()
    for section, cls in {"": FlatCakeConfig, **SECTIONS}.items():
        heading = f"`[{section}]`" if section else "Top level"
        body = next(s for s in sections if s.startswith(heading + "\n"))
        names = ["model"] if not section else [f.name for f in dataclasses.fields(cls)]
        for name in names:
            value = getattr(getattr(defaults, section) if section else defaults, name)
            dotted = f"{section}.{name}" if section else name
            row = re.search(rf"^\| `{re.escape(dotted)}` \| (\w+) \| `([^`]*)` \| (.+) \|$",
                            body, re.M)
            assert row, f"{dotted}: no row under {heading}"
            assert row.group(1) == type(value).__name__, dotted
            assert tomllib.loads(f"v = {row.group(2)}")["v"] == value, dotted
            assert len(row.group(3)) > 20, f"{dotted}: no description"
    assert [k.dotted for k in schema()] == keys()


def test_every_field_is_documented_by_the_string_under_it() -> None:
    strings = docs()
    for cls in (FlatCakeConfig, *SECTIONS.values()):
        for f in dataclasses.fields(cls):
            if f.name in SECTIONS:
                continue  # a section: its class docstring documents it
            assert strings[cls.__name__].get(f.name), f"{cls.__name__}.{f.name}"


def test_a_field_without_its_string_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import flatcake.config_reference as ref

    real = ref.docs()
    del real["EngineConfig"]["tenant_salt"]
    monkeypatch.setattr(ref, "docs", lambda: real)
    with pytest.raises(ValueError, match=r"engine\.tenant_salt has no documentation"):
        ref.schema()

