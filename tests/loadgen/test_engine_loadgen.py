"""``flatcake loadgen`` against a live vLLM server with the FlatCake connector (the
tiny random Llama of tests/connectors/engine_script.py, built offline): two prompts
visited twice each, under their session ids; the second visits report cached tokens and
the JSONL has one line per request; the server stops cleanly on Ctrl-C.

Runs under ./.venv-engine: ``.venv-engine/bin/pytest -q -m engine
tests/loadgen/test_engine_loadgen.py``; skipped where vLLM is not installed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (see scripts/engine_venv.sh)")

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
PROMPT_TOKENS = 256  # 8 blocks of 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(model: Path, store: Path, port: int, log: Path,
                 env: dict[str, str]) -> subprocess.Popen[bytes]:
    connector = {
        "kv_connector": "FlatCakeConnector", "kv_role": "kv_both",
        "kv_connector_module_path": "flatcake.connectors.vllm",
        "kv_connector_extra_config": {"store": {
            "root": str(store), "memory_capacity_bytes": 64 << 20,
            "ssd_capacity_bytes": 1 << 30, "session_file_bytes": 64 << 20}}}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
           "--port", str(port), "--model", str(model), "--served-model-name", "tiny",
           "--dtype", "float32", "--max-model-len", "1024", "--block-size", "32",
           "--enforce-eager", "--enable-prompt-tokens-details", "--shutdown-timeout", "30",
           "--kv-transfer-config", json.dumps(connector)]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited ({proc.returncode}):\n"
                                 f"{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(1)
    stop(proc)
    raise AssertionError(f"server not healthy in 150 s:\n{log.read_text()[-4000:]}")


def stop(proc: subprocess.Popen[bytes]) -> int:
    """Ctrl-C to the server's group; the whole group goes if it hangs."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError("server did not stop within 60 s of Ctrl-C") from None


@pytest.mark.timeout(300)
def test_loadgen_sees_cached_tokens_on_a_second_visit(tmp_path: Path) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_CPU_KVCACHE_SPACE="1")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p)
    model = tmp_path / "tiny-llama"
    subprocess.run([sys.executable, str(REPO / "tests/connectors/engine_script.py"),
                    "model", str(model)], env=env, check=True, timeout=120)
    port = free_port()
    log = tmp_path / "server.log"
    server = start_server(model, tmp_path / "store", port, log, env)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "flatcake.cli", "loadgen", f"http://127.0.0.1:{port}",
             "--working-set", "2", "--prompt-tokens", str(PROMPT_TOKENS),
             "--suffix-tokens", "8", "--max-tokens", "4", "--vocab-size", "512",
             "--max-requests", "4", "--session-ids", "--timeout", "60", "--json",
             "--no-plots", "--out", str(tmp_path / "out")],
            env=env, capture_output=True, text=True, timeout=150)
    finally:
        rc = stop(server)
    assert done.returncode == 0, done.stderr[-3000:]
    assert rc in (0, -signal.SIGINT, 130), log.read_text()[-3000:]
    summary = json.loads(done.stdout)["summary"]
    recs = [json.loads(x) for x in (tmp_path / "out/requests.jsonl").read_text().splitlines()]
    print(summary)
    assert len(recs) == 4 == summary["requests"] and summary["errors"] == 0
    by_index = sorted(recs, key=lambda r: r["index"])
    assert [r["session_id"] for r in by_index] == ["ws-0", "ws-1", "ws-0", "ws-1"]
    assert [r["cached_tokens"] for r in by_index[:2]] == [0, 0]
    # Each second visit finds its whole prompt (8 blocks) cached.
    assert all(r["cached_tokens"] >= PROMPT_TOKENS - 32 for r in by_index[2:])
    assert summary["cached_share"] > 0.4
