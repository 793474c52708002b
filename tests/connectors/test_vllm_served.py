"""The vLLM walkthrough (docs/integrations/vllm.md), run as written: the OpenAI-compatible
server with the FlatCake connector, the page's chat client for three turns, ``/metrics``,
a stop, a restart over the same store, and one more turn whose history comes back from
SSD.

The commands are the page's own blocks (``<!-- walkthrough:NAME -->``), with only
``/tmp/flatcake-demo`` -> a temporary directory, port 8000 -> a free port and
``.venv-engine/bin/python`` -> this interpreter (the engine venv). Runs under
./.venv-engine (``make test`` does it); skipped where vLLM is not installed.
"""

from __future__ import annotations

import json
import os
import re
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
BLOCK = 32
WALKTHROUGH = REPO / "docs" / "integrations" / "vllm.md"


def walkthrough_block(name: str) -> str:
    """The fenced block right after ``<!-- walkthrough:NAME -->`` in the walkthrough."""
    text = WALKTHROUGH.read_text()
    m = re.search(rf"<!-- walkthrough:{name} -->\n(?:<!-- doc: [^>]*-->\n)?```\w*\n(.*?)\n```",
                  text, re.S)
    if m is None:
        raise AssertionError(f"{WALKTHROUGH.name} has no walkthrough:{name} block")
    return m.group(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Walkthrough:
    """The walkthrough's commands, pointed at ``root`` and ``port``."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port = root, port
        self.env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p)

    def text(self, name: str) -> str:
        return (walkthrough_block(name).replace("/tmp/flatcake-demo", str(self.root))
                .replace("127.0.0.1:8000", f"127.0.0.1:{self.port}")
                .replace("--port 8000", f"--port {self.port}")
                .replace(".venv-engine/bin/python", sys.executable)
                .replace(".venv/bin/flatcake", f"{sys.executable} -m flatcake.cli"))

    def start_server(self, log: Path) -> subprocess.Popen[bytes]:
        """The serve block (model build, then the server) in its own process group."""
        with open(log, "ab") as out:
            proc = subprocess.Popen(["bash", "-c", self.text("serve")], cwd=REPO,
                                    env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"server exited ({proc.returncode}):\n"
                                     f"{log.read_text()[-6000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health",
                                            timeout=5) as r:
                    if r.status == 200:
                        return proc
            except OSError:
                pass
            time.sleep(2)
        self.stop(proc)
        raise AssertionError(f"server not healthy in time:\n{log.read_text()[-6000:]}")

    def stop(self, proc: subprocess.Popen[bytes]) -> int:
        """Ctrl-C, as a user stops it; the whole group goes if it hangs."""
        os.killpg(proc.pid, signal.SIGINT)
        try:
            return proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError("server did not stop within 120 s of Ctrl-C") from None

    def chat(self, turns: int) -> list[dict]:
        client = self.root / "chat.py"
        client.write_text(self.text("client"))
        proc = subprocess.run([sys.executable, str(client), str(turns)], env=self.env,
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise AssertionError(f"client failed:\n{proc.stdout}\n{proc.stderr[-4000:]}")
        return [json.loads(line) for line in proc.stdout.splitlines()]

    def inspect(self) -> str:
        proc = subprocess.run(["bash", "-c", self.text("inspect")], cwd=REPO, env=self.env,
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise AssertionError(f"inspect failed:\n{proc.stdout}\n{proc.stderr[-4000:]}")
        return proc.stdout

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30) as r:
            return str(r.read().decode())


def documented_series() -> set[str]:
    """Every ``vllm:flatcake_*`` name the walkthrough's metrics block lists."""
    return set(re.findall(r"vllm:flatcake_\w+", walkthrough_block("metrics")))


@pytest.mark.timeout(1200)  # two server starts, ~1-2 min each on 2 busy cores
def test_readme_walkthrough_serves_and_restarts(tmp_path: Path) -> None:
    w = Walkthrough(tmp_path, free_port())
    log = tmp_path / "server.log"
    server = w.start_server(log)
    try:
        first = w.chat(3)
        print("first server:", *first, sep="\n")
        scraped = w.metrics()
        inspected = w.inspect()
        print(inspected)
    finally:
        rc = w.stop(server)
    assert rc in (0, -signal.SIGINT, 130), log.read_text()[-4000:]
    # The worker's FlatCake half closed within its bound: half of vLLM's exit grace.
    grace = float(os.environ.get("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", "5"))
    closed = re.findall(r"FlatCake worker side closed in (\S+) s \(writes drained for at "
                        r"most (\S+) s\)", log.read_text())
    assert [bound for _, bound in closed] == [f"{grace / 2:.1f}"], log.read_text()[-4000:]
    assert all(float(took) <= float(bound) + 1.0 for took, bound in closed), closed
    # Turn 0: a 92-token prompt (90 words and the two role words): its 2 full blocks
    # go to SSD (first turn). Turn 1 gets them back; its short reply puts its new
    # blocks in host memory; turn 2 hits both media.
    assert [t["turn_index"] for t in first] == [0, 1, 2]
    assert all(t["session_id"] == "alice-42" for t in first)
    assert first[0]["placement"] == "ssd:first_turn" and first[0]["stored_blocks"] == 2
    assert first[0]["cached_tokens"] == 0
    # vLLM's own prefix cache holds the history in this process: FlatCake adds nothing
    # it already has, and the answer reports every cached token.
    assert first[1]["cached_tokens"] >= 2 * BLOCK and first[2]["cached_tokens"] >= 4 * BLOCK
    assert first[1]["placement"] == "memory:short_reply"
    names = set(re.findall(r"^(vllm:flatcake_\w+?)(?:_total)?[{ ]", scraped, re.M))
    want = {n.removesuffix("_total") for n in documented_series()}
    assert want and want <= names, sorted(want - names)
    # The live store's own budgets (the serve block's), not the CLI's defaults.
    assert "recorded by the store" in inspected
    assert re.search(r"memory +used .* of 64\.0 MiB", inspected), inspected
    assert re.search(r"ssd +used .* of 1024\.0 MiB", inspected), inspected
    stored = re.search(r'^vllm:flatcake_stores_ok_total\{[^}]*\} (\S+)', scraped, re.M)
    assert stored is not None and float(stored.group(1)) >= 3

    # Same command, same store: the history placed on SSD comes back from its files.
    server = w.start_server(log)
    try:
        (again,) = w.chat(1)
        print("restarted server:", again)
    finally:
        w.stop(server)
    assert again["session_id"] == "alice-42"
    assert again["loaded_tokens_ssd"] == 2 * BLOCK and again["load_error_blocks"] == 0
    assert again["cached_tokens"] == 2 * BLOCK
    assert len(json.loads((tmp_path / "history.json").read_text())) == 8
    # Both SSD turns are on disk, whole (crc32-checked), after the second Ctrl-C.
    assert ssd_segments(tmp_path / "store", "alice-42") == [2, again["stored_blocks"]]


def ssd_segments(store: Path, session_id: str) -> list[int]:
    """Blocks of each valid segment in ``session_id``'s file."""
    from flatcake.cio.filescan import scan_session_file

    for path in sorted((store / "sessions").iterdir()):
        header, ok, _bad = scan_session_file(path)
        if header.session_id == session_id:
            return [s.header.num_blocks for s in ok]
    return []
