"""The configuration page of the docs site, generated from the configuration's schema.

``scripts/docs_hooks.py`` puts ``markdown()`` where ``docs/usage/configuration.md`` says
``<!-- config-reference -->`` each time the site is built, so the page lists exactly the
keys ``flatcake.config`` parses: per section, each key with its type, default and the
string documenting it under its field (``docs()`` reads them from the source).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from typing import Any

from flatcake.config import SECTIONS, FlatCakeConfig


@dataclasses.dataclass(frozen=True, slots=True)
class Key:
    """One key of the schema as the page lists it.

    Attributes:
        section: the TOML table it is set in ("" for a top-level key).
        name: the field's name.
        type: ``int``, ``float``, ``str`` or ``bool``.
        default: the default as TOML writes it.
        doc: the string under the field, on one line.
    """

    section: str
    name: str
    type: str
    default: str
    doc: str

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.name}" if self.section else self.name


def docs() -> dict[str, dict[str, str]]:
    """Class name -> field -> the string literal under the field, read from the modules
    of ``flatcake.config`` that define the sections."""
    out: dict[str, dict[str, str]] = {}
    modules = dict.fromkeys(inspect.getmodule(cls) for cls in (FlatCakeConfig,
                                                               *SECTIONS.values()))
    body = [node for module in modules
            for node in ast.parse(inspect.getsource(module)).body]  # type: ignore[arg-type]
    for node in body:
        if not isinstance(node, ast.ClassDef):
            continue
        fields = out.setdefault(node.name, {})
        for here, after in zip(node.body, node.body[1:], strict=False):
            if isinstance(here, ast.AnnAssign) and isinstance(here.target, ast.Name) \
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                    and isinstance(after.value.value, str):
                fields[here.target.id] = " ".join(after.value.value.split())
    return out


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def schema() -> list[Key]:
    """Every key, ``model`` first, then each section's in the order of its fields."""
    strings = docs()
    defaults = FlatCakeConfig()
    top = strings["FlatCakeConfig"]
    out = [Key("", "model", "str", _toml(defaults.model), top["model"])]
    for section, cls in SECTIONS.items():
        mine = strings[cls.__name__]
        for f in dataclasses.fields(cls):
            value = getattr(getattr(defaults, section), f.name)
            if f.name not in mine:
                raise ValueError(f"config field {section}.{f.name} has no documentation "
                                 "string under it")
            out.append(Key(section, f.name, str(f.type), _toml(value), mine[f.name]))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """Each section: how to set its keys, then a table of them."""
    keys = schema()
    lines: list[str] = []
    for section in ("", *SECTIONS):
        cls = SECTIONS.get(section, FlatCakeConfig)
        title = f"`[{section}]`" if section else "Top level"
        summary = " ".join((inspect.getdoc(cls) or "").split("\n\n")[0].split())
        example = next(k for k in keys if k.section == section)
        env = f"FLATCAKE_{section.upper()}__{example.name.upper()}" if section \
            else "FLATCAKE_MODEL"
        lines += ["", f"## {title}", "", summary, "",
                  f"Set in a TOML file{' under `[' + section + ']`' if section else ''}, "
                  f"as `{env}`, as `--set {example.dotted}=...`"
                  + (", or in an engine's extra config." if section else "."),
                  "", "| key | type | default | what it does |", "|---|---|---|---|"]
        lines += [f"| `{k.dotted}` | {k.type} | `{_cell(k.default)}` | {_cell(k.doc)} |"
                  for k in keys if k.section == section]
    return "\n".join(lines).lstrip("\n") + "\n"
