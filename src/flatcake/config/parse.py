"""Reading a configuration: a TOML file, ``FLATCAKE_*`` environment variables,
``section.field=value`` overrides (``--set``) and an engine's extra config, merged in
one place (``flatcake.config``'s docstring has the order)."""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flatcake.config.engine import EngineConfig
from flatcake.config.schema import SECTIONS, FlatCakeConfig, keys


def _unknown(key: str, where: str = "config") -> ValueError:
    close = difflib.get_close_matches(key, keys(), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ValueError(f"unknown {where} key {key!r}{hint} (every key: "
                      "docs/usage/configuration.md)")


def _coerce(section: str, name: str, raw: Any, target: Any) -> Any:
    """Convert a string (env, ``--set``, or a string in a TOML or JSON file) to the
    field's declared type."""
    if isinstance(raw, str) and target not in (str, "str"):
        text = raw.strip()
        if target in (bool, "bool"):
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"invalid config {section}.{name}={raw!r}: expected a boolean")
        try:
            if target in (int, "int"):
                return int(text.replace("_", ""))
            if target in (float, "float"):
                return float(text)
        except ValueError:
            raise ValueError(
                f"invalid config {section}.{name}={raw!r}: expected {target}"
            ) from None
    return raw


def apply_setting(cfg: FlatCakeConfig, section: str, name: str, raw: Any) -> FlatCakeConfig:
    """``cfg`` with ``section.name`` set from ``raw`` (a TOML, env or ``--set`` value),
    checked as ``load_config`` checks it: the one place a value enters a config."""
    if section == "" and name == "model":
        return dataclasses.replace(cfg, model=str(raw))
    cls = SECTIONS.get(section)
    fields = {f.name: f for f in dataclasses.fields(cls)} if cls is not None else {}
    if name not in fields:
        raise _unknown(f"{section}.{name}" if section else name)
    value = _coerce(section, name, raw, fields[name].type)
    current = getattr(cfg, section)
    return dataclasses.replace(cfg, **{section: dataclasses.replace(current, **{name: value})})


Setting = tuple[str, str, Any]  # (section, field, value); section "" for ``model``


def load_config(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Sequence[str] = (),
) -> FlatCakeConfig:
    """Build a config from defaults, a TOML file, ``FLATCAKE_*`` env vars and overrides."""
    settings: list[Setting] = []
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"config override {item!r} must look like section.field=value")
        dotted, raw = item.split("=", 1)
        section, _, name = dotted.strip().rpartition(".")
        settings.append((section, name, raw))
    return _merge(path, env, settings)


def _merge(path: str | Path | None, env: Mapping[str, str] | None,
           settings: Iterable[Setting], where: str = "") -> FlatCakeConfig:
    """Defaults, then the TOML file at ``path``, then the environment, then ``settings``
    (errors in those prefixed with ``where``)."""
    cfg = FlatCakeConfig()
    if path is not None:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
        for key, value in data.items():
            if isinstance(value, dict):
                for name, raw in value.items():
                    cfg = apply_setting(cfg, key, name, raw)
            else:
                cfg = apply_setting(cfg, "", key, value)
    environ = os.environ if env is None else env
    for key, raw in sorted(environ.items()):
        if not key.startswith("FLATCAKE_"):
            continue
        rest = key[len("FLATCAKE_"):].lower()
        if rest == "model":
            cfg = apply_setting(cfg, "", "model", raw)
        elif "__" in rest:
            section, name = rest.split("__", 1)
            cfg = apply_setting(cfg, section, name, raw)
    for section, name, raw in settings:
        try:
            cfg = apply_setting(cfg, section, name, raw)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}" if where else str(exc)) from None
    return cfg


_ENGINE_FIELDS = tuple(f.name for f in dataclasses.fields(EngineConfig))


def load_extra_config(where: str, extra: Mapping[str, Any] | None,
                      env: Mapping[str, str] | None = None, *,
                      ignore: Sequence[str] = ()) -> FlatCakeConfig:
    """The configuration of an engine host from its extra config (``where`` names it in
    errors: ``kv_connector_extra_config``), merged as ``load_config`` merges: defaults,
    then ``config_file`` (a TOML file), then ``FLATCAKE_*`` variables (``env``, by default
    ``os.environ``), then the extra config itself::

        {"store": {"root": "/nvme/flatcake"},          # a section, nested
         "placement.not_yet": true,                    # or dotted
         "tenant_salt": "team-a",                      # an engine key, bare
         "config_file": "/etc/flatcake.toml"}

    The geometry comes from the engine, so ``model`` is refused; keys in ``ignore`` (the
    engine's own) are skipped; any other unknown key is refused by name."""
    extra = {} if extra is None else extra
    if not isinstance(extra, Mapping):
        raise ValueError(f"{where} must be a JSON object, got {type(extra).__name__}")
    config_file = None
    settings: list[Setting] = []
    for key, value in extra.items():
        if not isinstance(key, str):
            raise ValueError(f"{where} keys must be strings, got {key!r}")
        section, dot, name = key.partition(".")
        if key in ignore:
            continue
        if key == "config_file":
            if not isinstance(value, str) or not value:
                raise ValueError(f"{where}.config_file must be a path, got {value!r}")
            config_file = value
        elif key == "model":
            raise ValueError(f"{where}.model is not accepted: the KV geometry comes from "
                             "the engine")
        elif key in _ENGINE_FIELDS:
            settings.append(("engine", key, _scalar(where, key, value)))
        elif key in SECTIONS:
            if not isinstance(value, Mapping):
                raise ValueError(f"{where}.{key} must be an object of {key} keys, got "
                                 f"{value!r}")
            settings += [(key, str(n), _scalar(where, f"{key}.{n}", v))
                         for n, v in value.items()]
        elif dot and section in SECTIONS:
            settings.append((section, name, _scalar(where, key, value)))
        else:
            raise _unknown(key, where)
    return _merge(config_file, env, settings, where)


def _scalar(where: str, key: str, value: Any) -> Any:
    if isinstance(value, Mapping | list | tuple) or value is None:
        raise ValueError(f"{where}.{key} must be a single value, got {value!r}")
    return value
