"""A writer paused past its lease writes nothing anyone is served (issue 40: a paused
attached store resumed after its lease ended, the service having rolled its store back and
handed the range to the next turn; the resumed worker wrote there, and 4 of 8 blocks of an
acknowledged turn were served with its bytes). Its range stays allocated until its
process is gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flatcake.store import FlatCakeStore
from tests.service.helpers import Service, pause
from tests.store.helpers import (
    SMALL,
    TO_MEMORY,
    block_bytes,
    empty_kv,
    random_kv,
    session_keys,
    small_config,
)

LEASE_S = 1.0

# The paused writer: an attached store that prepares a turn in memory (as ``store_turn``
# does), says where, waits for a line on stdin (it is paused there), then writes its
# bytes into the range and asks to publish them.
WRITER = """
import json, sys
from pathlib import Path
from flatcake.plan.requests import store_task
from flatcake.store import FlatCakeStore
from tests.store.helpers import SMALL, TO_MEMORY, random_kv, session_keys, small_config
sock, root = sys.argv[1], Path(sys.argv[2])
store = FlatCakeStore.open(root, SMALL, small_config(f"store.node=unix:{sock}",
                                                      "store.node_timeout_s=5"))
keys, kv = session_keys(1, 4), random_kv(SMALL, 4, seed=11)
plan = store.control.prepare_store("paused", keys, turn_index=TO_MEMORY.turn_index,
                                   context_tokens=TO_MEMORY.context_tokens,
                                   prev_reply_tokens=TO_MEMORY.prev_reply_tokens)
seq, target = store._exec.prepare_file(plan)
paged, table = store._paged(kv, list(range(4)), 4, unique=False)
seg = plan.segment
print(json.dumps([seg.medium.name, seg.offset, seg.total_bytes]), flush=True)
sys.stdin.readline()
out = store._exec.write(store_task("paused", plan, table), paged, seq, target)
print("wrote", out.done.ok, flush=True)
try:
    store.control.complete_store(plan, True)
except Exception as exc:
    print("refused", exc, flush=True)
print("done", flush=True)
sys.stdin.readline()
"""


@pytest.mark.timeout(120)
def test_a_writer_paused_past_its_lease_writes_nothing_served(tmp_path: Path) -> None:
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock",
                  "store.memory_capacity_bytes=4194304",
                  "store.ssd_capacity_bytes=268435456",
                  f"store.node_lease_s={LEASE_S}").start()
    cfg = small_config(f"store.node=unix:{svc.sock}", "store.node_timeout_s=5")
    store = FlatCakeStore.open(svc.root, SMALL, cfg)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    log = tmp_path / "writer.log"
    with open(log, "w") as err:
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(svc.sock),
                                   str(svc.root)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    watchdog = threading.Timer(60, writer.kill)  # a silent writer: its reads end
    watchdog.start()

    def line() -> str:
        assert writer.stdout is not None
        got = writer.stdout.readline()
        assert got, f"the writer stopped: {log.read_text()[-3000:]}"
        return got

    assert writer.stdin is not None and writer.stdout is not None
    try:
        # 1. The writer prepared its turn (a range of the arena) and is paused mid-write.
        medium, start, size = json.loads(line())
        assert medium == "MEMORY", svc.stderr()
        used = store.control.stats().memory_used_bytes
        pause(writer.pid)
        # 2. Its lease ends: its store is rolled back, never published.
        time.sleep(LEASE_S * 3)
        assert "lease ended" in svc.stderr()
        # 3. Another store writes a turn of another session: not into the paused range.
        keys, kv = session_keys(2, 4), random_kv(SMALL, 4, seed=12)
        done = store.store_turn("acked", keys, kv, list(range(4)), TO_MEMORY)
        assert done.num_blocks == 4
        (acked,) = [s for s in store.control.segments() if s.session_id == "acked"]
        assert acked.offset + acked.total_bytes <= start or start + size <= acked.offset, \
            f"the paused writer's range [{start}, {start + size}) was handed on"
        # 4. The writer resumes and writes its range; its store is never published.
        os.kill(writer.pid, signal.SIGCONT)
        writer.stdin.write("go\n")
        writer.stdin.flush()
        lines = [line()]
        while lines[-1].strip() != "done":
            lines.append(line())
        assert lines[0].split() == ["wrote", "True"], lines
        assert store.lookup(session_keys(1, 4)).num_blocks == 0
        # Every block served is the acknowledged one, byte for byte.
        got = empty_kv(SMALL, 4)
        assert store.load(keys, got, list(range(4))).num_blocks == 4
        wrong = [(layer, s) for layer in range(SMALL.num_layers) for s in range(4)
                 if block_bytes(got, layer, s, "kv_blocks") !=
                 block_bytes(kv, layer, s, "kv_blocks")]
        assert wrong == []
        # 5. Once the writer is gone, its range is freed.
        assert store.control.stats().memory_used_bytes == used + acked.total_bytes
        writer.stdin.write("exit\n")
        writer.stdin.flush()
        assert writer.wait(timeout=30) == 0
        deadline = time.monotonic() + 10
        while store.control.stats().memory_used_bytes != acked.total_bytes:
            assert time.monotonic() < deadline, store.control.stats()
            time.sleep(0.1)
        assert store.control.stats().stores_in_flight == 0
    finally:
        watchdog.cancel()
        if writer.poll() is None:
            os.kill(writer.pid, signal.SIGCONT)
            writer.kill()
            writer.wait(timeout=15)
        store.close()
        assert svc.stop() == 0, svc.stderr()
