"""Who calls is its connection, not the id a call names: another process that names an
attached store's or engine's id (to look up, to detach) is refused, and the one that
attached keeps working (issue 40: a second connection used ``s1``'s id to look up and
to detach ``s1``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from flatcake.service.endpoint import ask_status
from flatcake.store import FlatCakeStore
from tests.connectors.sides_harness import G, finish
from tests.service.helpers import Engine, Service
from tests.store.helpers import (
    TO_SSD,
    block_bytes,
    empty_kv,
    random_kv,
    session_keys,
    small_config,
)

# Another process: sends each call of argv[2] (JSON: [engine_id, verb, args]; {"hex": h}
# is bytes) over its own connection to the socket argv[1]; prints each answer's (ok,
# its error) as JSON.
INTRUDER = """
import json, sys, time
from flatcake.link import wire
from flatcake.link.frames import Connection
def arg(x):
    if isinstance(x, list):
        return [arg(v) for v in x]
    if isinstance(x, dict):
        return bytes.fromhex(x["hex"]) if "hex" in x else {}
    return x
sock = Connection(sys.argv[1], 5.0)
out = []
for i, (engine_id, method, args) in enumerate(json.loads(sys.argv[2])):
    sock.send(wire.call_frame(i, engine_id, method, arg(args)))
    try:
        reply = wire.decode_reply(sock.recv(time.monotonic() + 5.0))
    except TimeoutError:
        out.append([None, "no answer"])
        continue
    out.append([reply.ok, reply.error])
print(json.dumps(out))
sock.close()
"""


def intrude(sock: Path, calls: list[list[object]]) -> list[list[object]]:
    done = subprocess.run([sys.executable, "-c", INTRUDER, str(sock), json.dumps(calls)],
                          capture_output=True, text=True, timeout=60, check=True)
    out: list[list[object]] = json.loads(done.stdout)
    return out


def test_another_connection_cannot_call_as_an_attached_store_or_engine(tmp_path: Path
                                                                       ) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "store.memory_capacity_bytes=4194304",
                  "store.ssd_capacity_bytes=268435456").start()
    cfg = small_config(f"store.node=unix:{svc.sock}", "store.node_timeout_s=2")
    store = FlatCakeStore.open(svc.root, G, cfg)
    engine = Engine(svc.sock, seed=1)
    try:
        kv = random_kv(G, 8, seed=3)
        keys = session_keys(1, 4)
        assert store.store_turn("s1", keys, kv, list(range(4)), TO_SSD).num_blocks == 4
        p = finish(engine, "r0", list(range(100, 113)), [5, 6, 7, 8], out=3, session="e")
        assert p["stored_blocks"] == 3
        sid = store.control._id  # type: ignore[attr-defined]
        eid = engine.sched.engine_id
        answers = intrude(svc.sock, [
            [sid, "lookup", [[{"hex": k.hex()} for k in keys]]],
            [sid, "session_ids", []],
            [sid, "detach", []],
            [eid, "take_stats", []],
            [eid, "detach", []],
        ])
        # Every call refused, naming why; none ran.
        for ok, value in answers:
            assert ok is False, answers
            assert "attached over another connection" in str(value), answers
        st = ask_status(svc.sock, 5.0)
        assert list(st["stores"]) == [sid] and list(st["engines"]) == [eid]
        # Both still work as themselves.
        got = empty_kv(G, 8)
        assert store.load(keys, got, list(range(4))).num_blocks == 4
        for layer in range(G.num_layers):
            for s in range(4):
                assert block_bytes(got, layer, s, "kv_blocks") == \
                    block_bytes(kv, layer, s, "kv_blocks")
        assert store.control._id == sid  # type: ignore[attr-defined]  # not re-attached
        assert engine.sched.take_stats() != {} and engine.sched.engine_id == eid
    finally:
        engine.close()
        store.close()
        assert svc.stop() == 0, svc.stderr()
