"""The node service's wire: values of the declared types cross equal, anything else is
refused, every books verb names the parameters of the method it calls, and no module
that reads a peer's bytes (``link``, ``service``, the engine's client) can unpickle
them (read from the source)."""

from __future__ import annotations

import ast
import inspect
import struct
import tracemalloc
from pathlib import Path

import msgspec
import pytest

import flatcake
from flatcake.connectors.node_verbs import ATTACH, ENGINE
from flatcake.control import ControlPlane, LoadPlan
from flatcake.link import verbs, wire
from flatcake.plan import requests
from flatcake.plan.requests import load_task
from tests.control.helpers import make, skeys

SRC = Path(flatcake.__file__).parent
# Every module that reads what came over the node service's socket.
READERS = [*sorted((SRC / "link").glob("*.py")), *sorted((SRC / "service").glob("*.py")),
           SRC / "connectors" / "node_client.py", SRC / "connectors" / "node_verbs.py"]
# Modules (and callables) that run code from bytes.
UNSAFE = {"pickle", "cPickle", "_pickle", "cloudpickle", "dill", "marshal", "shelve",
          "joblib", "jsonpickle"}
UNSAFE_CALLS = {"eval", "exec", "loads", "load", "Unpickler"}


def unsafe_uses(path: Path) -> list[str]:
    """Imports of ``UNSAFE`` modules and calls of ``UNSAFE_CALLS`` on anything but
    msgspec, json or the wire in ``path`` (one line each)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [(node.module or "").split(".")[0]]
        found += [f"{path.name}:{node.lineno} imports {n}" for n in names if n in UNSAFE]
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            owner = ast.unparse(f.value) if isinstance(f, ast.Attribute) else ""
            if name in UNSAFE_CALLS and not owner.startswith(("msgspec", "json", "_")):
                found.append(f"{path.name}:{node.lineno} calls {ast.unparse(f)}")
    return found


def test_nothing_that_reads_the_socket_can_unpickle(tmp_path: Path) -> None:
    assert len(READERS) > 10
    assert [u for p in READERS for u in unsafe_uses(p)] == []
    # The scan sees what it looks for.
    probe = tmp_path / "probe.py"
    probe.write_text("import pickle\nfrom dill import loads\npickle.loads(b'')\n"
                     "msgspec.msgpack.decode(b'')\n")
    assert unsafe_uses(probe) == ["probe.py:1 imports pickle", "probe.py:2 imports dill",
                                  "probe.py:3 calls pickle.loads"]


def roundtrip(value: object, typ: object) -> object:
    return wire.decoder(typ).decode(wire.encode(value))


def test_the_books_values_cross_equal() -> None:
    cp, _ = make(memory_pages=8, copy_watermark=0.5)
    plan = cp.prepare_store("a", skeys("a", 3), turn_index=0, context_tokens=10**6)
    assert plan is not None
    assert roundtrip(plan, verbs.CONTROL["prepare_store"].reply) == plan
    cp.complete_store(plan, True)
    hit = cp.lookup(skeys("a", 3))
    back = roundtrip(hit, verbs.CONTROL["lookup"].reply)
    assert back == hit
    # A hit that crossed is served as the one that did not.
    task, lp = load_task(cp, "r", back, list(range(3)))
    assert lp.hit == hit and task.num_blocks == 3
    assert roundtrip(lp, LoadPlan) == lp
    assert roundtrip(cp.stats(), verbs.CONTROL["stats"].reply) == cp.stats()
    cp.complete_load("r")


@pytest.mark.parametrize(("verb", "args"), [
    (verbs.CONTROL["lookup"], [[1, 2]]),  # keys are bytes
    (verbs.CONTROL["lookup"], [[b"k"], b"more"]),  # one argument too many
    (verbs.CONTROL["segment"], ["7"]),
    (verbs.CONTROL["prepare_store"], ["s", [b"k"]]),  # turn_index, context_tokens missing
    (verbs.WORKER, [0, {"num_layers": "three"}, [1, False]]),
    (verbs.ATTACH_STORE, ["n", 1, None]),
])
def test_arguments_of_another_type_are_refused(verb: verbs.Verb, args: list[object]) -> None:
    call = wire.decode_call(wire.call_frame(1, "", verb.name, args))
    with pytest.raises(wire.FrameError):
        verb.decode_args(call.args)


def test_every_verb_names_the_parameters_of_what_it_calls() -> None:
    from flatcake.connectors.scheduler_side import SchedulerSide

    service_only = {"servable": (), "prepare_load": ("stream",)}
    for name, verb in verbs.CONTROL.items():
        if name == "servable":
            continue
        called = getattr(ControlPlane, name, None) or getattr(requests, name)
        params = set(inspect.signature(called).parameters)
        assert set(verb.fields) - set(service_only.get(name, ())) <= params, name
    # new_request of each entered first, request_finished of each done, after_alloc of
    # each admitted
    engine_service_only = {"num_matched_tokens": ("entered", "new", "done", "admitted")}
    for name, verb in ENGINE.items():
        if name not in ("step", "update"):
            params = set(inspect.signature(getattr(SchedulerSide, name)).parameters)
            assert set(verb.fields) - set(engine_service_only.get(name, ())) <= params, name
    # One name, one verb, across the families.
    names = [ATTACH.name, *verbs.SERVICE, *verbs.CONTROL, *ENGINE]
    assert len(names) == len(set(names))


def test_a_frame_of_another_version_is_refused_by_name() -> None:
    frame = msgspec.msgpack.encode([wire.PROTOCOL_VERSION + 1, 9, "", "status", []])
    with pytest.raises(wire.BadFrame, match=f"{wire.OTHER_VERSION} "
                       f"{wire.PROTOCOL_VERSION + 1} of the client") as got:
        wire.decode_call(frame)
    assert got.value.call_id == 9


def test_a_frame_of_millions_of_items_is_refused_without_building_them() -> None:
    # A msgpack array of 20 million nils after another version and a call id: naming
    # what is wrong reads its first two items only.
    n = 20_000_000
    other = wire.PROTOCOL_VERSION + 1  # a positive fixint, one byte
    frame = b"\xdd" + struct.pack(">I", n) + bytes([other, 3]) + b"\xc0" * (n - 2)
    tracemalloc.start()
    try:
        with pytest.raises(wire.BadFrame, match=f"{wire.OTHER_VERSION} {other} of the client"):
            wire.decode_call(frame)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < n  # not a Python object per item (8 bytes a pointer at least)
    # A call naming more than MAX_GAVE_UP calls given up is refused.
    too_many = tuple(range(wire.MAX_GAVE_UP + 1))
    with pytest.raises(wire.BadFrame, match="length <= 256"):
        wire.decode_call(wire.call_frame(1, "", "status", [], None, too_many))
