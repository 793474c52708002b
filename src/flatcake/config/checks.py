"""The configuration's units and the checks every section's ``__post_init__`` runs:
a bad value raises one ``ValueError`` naming the key and the value."""

from __future__ import annotations

import dataclasses
import math

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
TIB = 1024 * GIB


def check(cond: bool, name: str, value: object, why: str) -> None:
    if not cond:
        raise ValueError(f"invalid config {name}={value!r}: {why}")


_TYPES: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "str": (str,),
                                       "bool": (bool,)}


def check_types(obj: object, section: str) -> None:
    """Every field holds its declared type (``bool`` is not an ``int``, ``1.5`` is not
    one either, a float is finite: ``inf`` would be a timeout that never fires, ``nan``
    fails every bound with a message that does not say why), so a wrong TOML or Python
    value fails here naming the field instead of deep inside the store."""
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        want = _TYPES.get(str(f.type))
        if want is None:
            continue
        value = getattr(obj, f.name)
        ok = isinstance(value, want) and (bool in want or not isinstance(value, bool))
        check(ok, f"{section}.{f.name}", value, f"must be a {f.type}")
        check(not isinstance(value, float) or math.isfinite(value), f"{section}.{f.name}",
               value, "must be a finite number")
