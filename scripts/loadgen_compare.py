"""Side by side on a live vLLM: one ``flatcake loadgen`` working-set sweep against each
server configuration, started with identical flags, alternating over repeats.

    .venv/bin/python scripts/loadgen_compare.py --out loadgen-compare

Configurations (``--configs``): ``none`` (vLLM alone, its own prefix cache),
``flatcake`` (the FlatCake connector with ``--flatcake-memory-mib`` of host memory and
``--flatcake-ssd-mib`` of SSD under a fresh store root), ``null-connector`` (vLLM with
a connector that does nothing, ``scripts/null_connector.py``: what the engine's
connector hooks cost on their own), ``flatcake-not-yet`` (the same
with ``placement.not_yet`` on: its SSD wear beside today's rule),
``flatcake-write-back`` (``not_yet`` with ``placement.not_yet_write_back``: memory
reclaim writes a not-yet home to the SSD rather than drop it) and ``lmcache`` (LMCache's
multi-process mode: an ``lmcache server`` with the same host memory as its L1 and its
``fs_native`` L2 adapter under a fresh folder, vLLM's ``LMCacheMPConnector``, the CPU
transfer path ``LMCACHE_MP_TRANSFER_MODE=engine_driven NO_GPU_EXT=1``). LMCache is not a
dependency of the project: ``--lmcache-path DIR`` names a folder holding it, e.g. ``pip
install --no-deps --target DIR lmcache`` (its imports beyond vLLM's are optional with
``--disable-observability``). Repeat ``r`` runs them in order when r is even, reversed
when odd (none, flatcake, flatcake, none, ...), each on a fresh server; on each server
every working set gets one loadgen run: its ``--warmup`` pass (one visit of each prompt,
not measured), then ``--duration`` measured seconds (closed loop at ``--concurrency``, or
with ``--rate`` open-loop Poisson arrivals that never fall into lockstep with the engine's
steps; ``--api chat`` sends chat completions, one user message per prompt, as a chat
client does); with ``--trace``, one more run
replays a trace's sessions (``flatcake loadgen --trace``, scaled to the server's
context) for ``--trace-duration`` seconds. With ``--interleave``, each configuration's
server starts once and stays up; each repeat runs every working set on each server in
turn (one loaded at a time, the others idle), so a noisy stretch of a shared machine
falls on both sides of a comparison rather than on one server's life. A second table
divides each run by the first configuration's run of the same repeat. Seeds are the same
for every configuration and differ between working sets, so each server sees the same
prompts and no two working sets share one. Each stop is SIGTERM to the API server, as a
supervisor stops a service (``--stop group``: SIGINT to its whole process group, as a
terminal's Ctrl-C), with ``--shutdown-timeout 30``; a server still up after
``STOP_WAIT_S`` is killed. The tables say how each stop went (from the server's log: a
worker that died, one vLLM sent SIGTERM past its grace period, an engine it
force-killed) and when the worker process left, with the CPU seconds it used meanwhile.
Writes ``compare.md`` and ``compare.json`` to --out, and each run's loadgen output under
``--out/runs``.

The model is a random Llama built offline in --model when it is missing (12 layers,
hidden 512, 4 KV heads of 64: 24,576 B of float32 KV per token, as in issue 28), so
prefill is costly enough on a CPU for a restore to matter. vLLM's own cache is capped
with ``--num-gpu-blocks-override``. Needs ./.venv-engine (scripts/engine_venv.sh).
"""

from __future__ import annotations

import argparse
import contextlib
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
from typing import Any

from flatcake import docsout
from flatcake.loadgen.compare import label, paired_table, table
from flatcake.loadgen.procstat import WORKER, cpu_seconds, group_procs, loadavg, model_thread

REPO = Path(__file__).resolve().parents[1]
ENGINE_PY = REPO / ".venv-engine" / "bin" / "python"
STOP_WAIT_S = 90
START_WAIT_S = 900  # a loaded 2-core machine takes minutes to start an engine
# Between interleaved runs: vLLM's engine core spins for a second after its last message
# (``MessageQueue.acquire_read``), which would fall on the next server's run.
SETTLE_S = 2.0
SEED_STRIDE = 1000  # an interleaved repeat's seeds: working set k + 1 + 1000 * repeat
RESERVED_CPUS = 1  # vLLM's own default on x86 for one rank without a KV connector
BLOCK = 32
CONFIGS = ("none", "null-connector", "flatcake", "flatcake-not-yet", "flatcake-write-back",
           "lmcache")
# The ``placement`` keys of each FlatCake configuration beside today's rule.
PLACEMENT = {"flatcake-not-yet": {"not_yet": True},
             "flatcake-write-back": {"not_yet": True, "not_yet_write_back": True}}
TRACE_KINDS = ("agent", "chat", "mixed")
# What the server log says when a stop was not clean.
STOP_EVENTS = {
    "a worker died": r"died unexpectedly",
    "vLLM force-killed the engine": r"force killing remaining process",
    "engine fatal error": r"EngineCore encountered a fatal error",
    "vLLM sent SIGTERM to a worker past its grace period":
        r"workers still running after grace period; sending SIGTERM count=[1-9]",
}
STOP_SIGNAL = {"server": "SIGTERM to the API server", "group": "SIGINT to its group"}

BUILD_MODEL = """
import sys, torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
out, layers, hidden, heads, kv_heads, inter = sys.argv[1], *map(int, sys.argv[2:])
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 512)}}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                        unk_token="<unk>").save_pretrained(out)
torch.manual_seed(0)
LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=hidden, intermediate_size=inter,
    num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
    max_position_embeddings=16384, bos_token_id=1, eos_token_id=2,
    tie_word_embeddings=False)).save_pretrained(out)
"""


CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
"""``--api chat`` on the random model: a message's words are its tokens (``chat_body``)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env(lmcache: Path | None = None, scripts: bool = False) -> dict[str, str]:
    e = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
             VLLM_CPU_KVCACHE_SPACE="1")
    # The same cores for every configuration: vLLM's CPU platform reserves one more core
    # per rank whenever a KV connector is configured, which on a small machine moves the
    # compute threads onto the cores the engine core and API server run on.
    e.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", str(RESERVED_CPUS))
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), str(lmcache or ""),
                                                   str(REPO / "scripts") if scripts else "",
                                                   os.environ.get("PYTHONPATH", "")) if p)
    if lmcache is not None:
        e.update(NO_GPU_EXT="1", LMCACHE_MP_TRANSFER_MODE="engine_driven",
                 LMCACHE_DISABLE_BANNER="1")
    return e


class LMCacheServer:
    """``lmcache server`` (multi-process mode) in its own process group."""

    def __init__(self, args: argparse.Namespace, store: Path, log: Path) -> None:
        self.port = free_port()
        store.mkdir(parents=True, exist_ok=True)
        cmd = [str(ENGINE_PY), "-m", "lmcache.cli.main", "server", "--host", "127.0.0.1",
               "--port", str(self.port), "--http-port", str(free_port()),
               "--l1-size-gb", str(args.flatcake_memory_mib / 1024),
               "--eviction-policy", "LRU", "--supported-transfer-mode", "engine_driven",
               "--disable-observability",
               "--l2-adapter", json.dumps({"type": "fs_native", "base_path": str(store)})]
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env(args.lmcache_path),
                                         stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + 120
        while "Application startup complete" not in log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"lmcache server did not start; see {log}")
            time.sleep(1)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


class Server:
    """One vLLM OpenAI server in its own process group, its log in ``log``."""

    def __init__(self, args: argparse.Namespace, config: str, store: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.lmcache = (LMCacheServer(args, store, log.with_suffix(".lmcache.log"))
                        if config == "lmcache" else None)
        cmd = [str(ENGINE_PY), "-m", "vllm.entrypoints.openai.api_server",
               "--host", "127.0.0.1", "--port", str(self.port), "--model", str(args.model),
               "--served-model-name", "model", "--dtype", "float32",
               "--max-model-len", str(args.max_model_len), "--block-size", str(BLOCK),
               "--num-gpu-blocks-override", str(args.vllm_blocks), "--enforce-eager",
               "--enable-prompt-tokens-details", "--shutdown-timeout", "30"]
        if args.api == "chat":  # the random model has no chat template: its words alone
            template = log.parent / "chat-template.jinja"
            template.write_text(CHAT_TEMPLATE)
            cmd += ["--chat-template", str(template)]
        if config.startswith("flatcake"):
            cmd += ["--kv-transfer-config", json.dumps({
                "kv_connector": "FlatCakeConnector", "kv_role": "kv_both",
                "kv_connector_module_path": "flatcake.connectors.vllm",
                "kv_connector_extra_config": {"store": {
                    "root": str(store), "memory_capacity_bytes": args.flatcake_memory_mib << 20,
                    "ssd_capacity_bytes": args.flatcake_ssd_mib << 20},
                    "placement": PLACEMENT.get(config, {})}})]
        if config == "null-connector":
            cmd += ["--kv-transfer-config", json.dumps({
                "kv_connector": "NullConnector", "kv_role": "kv_both",
                "kv_connector_module_path": "null_connector"})]
        if self.lmcache is not None:
            cmd += ["--kv-transfer-config", json.dumps({
                "kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1",
                                              "lmcache.mp.port": self.lmcache.port}})]
        self.started = time.monotonic()
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env(
                args.lmcache_path if self.lmcache else None,
                scripts=config == "null-connector"), stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_WAIT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if self.lmcache is not None:
                    self.lmcache.stop()
                raise SystemExit(f"server exited ({self.proc.returncode}); see {log}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                    if r.status == 200:
                        self.start_s = time.monotonic() - self.started
                        return
            except OSError:
                pass
            time.sleep(2)
        self.stop("group")
        raise SystemExit(f"server not healthy in {START_WAIT_S} s; see {log}")

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds its processes used so far by role (``procstat.cpu_seconds``),
        LMCache's server, a process group of its own, as ``cache_server``."""
        cpu = cpu_seconds(self.proc.pid)
        if self.lmcache is not None:
            cpu["cache_server"] = sum(cpu_seconds(self.lmcache.proc.pid).values())
        return cpu

    def flatcake_metrics(self) -> dict[str, float]:
        """The ``vllm:flatcake_*`` series by name and labels (the engine label left
        out), without Prometheus' ``_created`` timestamps."""
        try:
            with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as r:
                text = r.read().decode()
        except OSError:
            return {}
        got: dict[str, float] = {}
        for m in re.finditer(r"^vllm:flatcake_(\w+?)(\{[^}]*\})? (\S+)$", text, re.M):
            if m.group(1).endswith("_created"):
                continue
            labels = ",".join(x for x in re.findall(r'(\w+="[^"]*")', m.group(2) or "")
                              if not x.startswith(("engine=", "model_name=")))
            key = m.group(1) + (f"{{{labels}}}" if labels else "")
            got[key] = got.get(key, 0.0) + float(m.group(3))
        return got

    def stop(self, how: str) -> dict[str, Any]:
        """SIGTERM to the API server (``server``, as a supervisor stops a service:
        systemd's ``KillMode=mixed``, ``docker stop``, Kubernetes) or SIGINT to its
        whole process group (``group``, as a terminal's Ctrl-C does); a kill of the
        group after ``STOP_WAIT_S``. Says how it went, from the log, and when the
        worker process left (seconds after the signal) with the CPU seconds it used
        meanwhile."""
        before = group_procs(self.proc.pid)
        workers = {pid: cpu for pid, (name, _, cpu) in before.items() if name == WORKER}
        last, gone = dict(workers), {}
        start = time.monotonic()
        if how == "group":
            os.killpg(self.proc.pid, signal.SIGINT)
        else:
            self.proc.send_signal(signal.SIGTERM)
        forced, rc = False, None
        while rc is None:
            now = group_procs(self.proc.pid)
            t = time.monotonic() - start
            for pid in workers:
                if pid in now and now[pid][1] != "Z":
                    last[pid] = now[pid][2]
                else:
                    gone.setdefault(pid, t)
            rc = self.proc.poll()
            if rc is None and t > STOP_WAIT_S:
                os.killpg(self.proc.pid, signal.SIGKILL)
                rc, forced = self.proc.wait(), True
            elif rc is None:
                time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):  # a child left behind
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.lmcache is not None:
            self.lmcache.stop()
        tail = self.log.read_text(errors="replace")[-200_000:]
        events = [name for name, pattern in STOP_EVENTS.items() if re.search(pattern, tail)]
        if forced:
            events.insert(0, f"killed by this script after {STOP_WAIT_S} s")
        return {"stop_s": round(time.monotonic() - start, 1), "rc": rc,
                "worker_exit_s": round(max(gone.values()), 1) if gone else None,
                "worker_exit_cpu_s": round(sum(last[p] - workers[p] for p in workers), 2)
                if workers else None,
                "clean": not events, "events": events}


def loadgen(args: argparse.Namespace, url: str, ws: int | None, seed: int, out: Path) -> dict:
    """One loadgen run: a working set's warm-up (one visit of each prompt), then
    ``--duration`` measured seconds on the same stream; ``ws`` None: ``--trace``'s
    sessions from the start for ``--trace-duration`` seconds."""
    if ws is None:
        source = (["--workload", args.trace] if args.trace in TRACE_KINDS
                  else ["--trace", args.trace])
        workload = [*source, "--duration", str(args.trace_duration)]
        if args.trace_sessions:
            workload += ["--sessions", str(args.trace_sessions)]
    else:
        workload = ["--working-set", str(ws), "--prompt-tokens", str(args.prompt_tokens),
                    "--suffix-tokens", "32", "--warmup", "--duration", str(args.duration)]
    cmd = [sys.executable, "-m", "flatcake.cli", "loadgen", url, *workload,
           "--max-tokens", str(args.max_tokens), "--vocab-size", "512",
           "--concurrency", str(args.concurrency), "--seed", str(seed), "--timeout", "300",
           "--api", args.api, "--json", "--no-plots", "--out", str(out)]
    if args.rate is not None:
        cmd += ["--rate", str(args.rate)]
    if args.session_ids:
        cmd.append("--session-ids")
    done = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=1200)
    if done.returncode not in (0, 1):
        raise SystemExit(f"loadgen failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return dict(json.loads(done.stdout)["summary"])


def build_model(model: Path) -> None:
    if model.is_dir():
        return
    print(f"building the random model in {model}", flush=True)
    subprocess.run([str(ENGINE_PY), "-c", BUILD_MODEL, str(model), "12", "512", "8", "4",
                    "1024"], env=env(), check=True, timeout=600, capture_output=True)


def start(args: argparse.Namespace, config: str, tag: str, began: float) -> Server | dict:
    """A server for ``config`` under a fresh store root, or the record of its failed
    start (the other configurations still run)."""
    print(f"[{time.monotonic() - began:6.0f} s] {tag}: starting vLLM "
          f"(load {loadavg()})", flush=True)
    try:
        return Server(args, config, args.out / "stores" / tag,
                      args.out / f"server-{tag}.log")
    except SystemExit as failed:
        print(f"[{time.monotonic() - began:6.0f} s] {tag}: {failed}", flush=True)
        return {"run": tag, "start_s": None, "stop_s": None, "rc": None,
                "worker_exit_s": None, "worker_exit_cpu_s": None, "clean": False,
                "events": [f"did not start: {failed}"], "session_files": None,
                "flatcake_metrics": {}}


def measure(args: argparse.Namespace, server: Server, tag: str, r: int, config: str,
            ws: int | None, seed: int, began: float, idle: dict[str, Server]) -> dict:
    """One loadgen run against ``server`` and what its processes (and the ``idle``
    servers beside it) used meanwhile."""
    before, cpu0 = loadavg(), server.cpu_seconds()
    wait0 = model_thread(server.proc.pid)
    idle0 = {c: sum(s.cpu_seconds().values()) for c, s in idle.items()}
    summary = loadgen(args, server.url, ws, seed, args.out / "runs" /
                      f"{tag}-{'trace' if ws is None else f'ws{ws}'}")
    cpu = {k: round(v - cpu0[k], 2) for k, v in server.cpu_seconds().items()}
    result = {"repeat": r, "config": config, "working_set": ws, "summary": summary,
              "cpu_s": cpu, "load_before": before, "load_after": loadavg(),
              "model_thread_s": [round(b - a, 3) for a, b in zip(
                  wait0, model_thread(server.proc.pid), strict=True)],
              "idle_servers_cpu_s": round(sum(
                  sum(s.cpu_seconds().values()) - idle0[c]
                  for c, s in idle.items()), 2)}
    print(f"[{time.monotonic() - began:6.0f} s]   {tag} {label(ws)}: TTFT p50 "
          f"{summary['ttft_p50_s']:.3f} s, cached {100 * (summary['cached_share'] or 0):.1f} "
          f"%, {summary['req_per_s']:.2f} req/s, CPU s worker {cpu['worker']:.1f} engine "
          f"{cpu['engine']:.1f} api {cpu['api']:.1f}, model thread waited "
          f"{result['model_thread_s'][1]:.1f} s", flush=True)
    return result


def finish(args: argparse.Namespace, server: Server, tag: str, began: float) -> dict:
    """Stop ``server``; its stop, FlatCake's metrics and session files."""
    metrics = server.flatcake_metrics()
    stopped = server.stop(args.stop)
    store = args.out / "stores" / tag
    files = (len(list((store / "sessions").iterdir()))
             if (store / "sessions").is_dir() else None)
    print(f"[{time.monotonic() - began:6.0f} s] {tag}: stopped in {stopped['stop_s']} s "
          f"(worker out in {stopped['worker_exit_s']} s, {stopped['worker_exit_cpu_s']} "
          f"CPU s), {'cleanly' if stopped['clean'] else ', '.join(stopped['events'])}",
          flush=True)
    return {"run": tag, "start_s": round(server.start_s, 1), **stopped,
            "session_files": files, "flatcake_metrics": metrics}


def in_turn(configs: tuple[str, ...], r: int) -> tuple[str, ...]:
    """Repeat ``r``'s order: as given when even, reversed when odd."""
    return configs if r % 2 == 0 else configs[::-1]


def sequential(args, configs, loads, results, stops, began) -> None:
    """A fresh server per repeat and configuration; every load on it in turn."""
    for r in range(args.repeats):
        for config in in_turn(configs, r):
            tag = f"r{r}-{config}"
            server = start(args, config, tag, began)
            if isinstance(server, dict):
                stops.append(server)
                continue
            try:
                for k, ws in enumerate(loads):
                    results.append(measure(args, server, tag, r, config, ws, k + 1,
                                           began, {}))
            finally:
                stops.append(finish(args, server, tag, began))


def interleaved(args, configs, loads, results, stops, began) -> None:
    """Every configuration's server up at once, for the whole run; each repeat runs
    each load on every server in turn (only one loaded at a time), so a slow stretch
    of a shared machine falls on both sides of a comparison instead of on one
    server's whole life. Each repeat sends prompts and questions the servers have not
    seen (its own seed): a repeat of the same requests would find every store already
    made, a cost a fresh server pays."""
    servers: dict[str, Server] = {}
    try:
        for config in configs:
            server = start(args, config, f"i-{config}", began)
            if isinstance(server, dict):
                stops.append(server)
            else:
                servers[config] = server
        for r in range(args.repeats):
            for k, ws in enumerate(loads):
                for config in in_turn(tuple(servers), r):
                    idle = {c: s for c, s in servers.items() if c != config}
                    time.sleep(SETTLE_S)
                    results.append(measure(args, servers[config], f"r{r}-{config}", r,
                                           config, ws, k + 1 + SEED_STRIDE * r, began,
                                           idle))
    finally:
        for config, server in servers.items():
            stops.append(finish(args, server, f"i-{config}", began))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("loadgen-compare"))
    p.add_argument("--model", type=Path, default=Path("/tmp/flatcake-loadgen-model"))
    p.add_argument("--working-sets", default="4,32",
                   help="prompts per working set ('': none, e.g. a --trace run alone)")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--concurrency", type=int, default=2,
                   help="closed loop: requests in flight (default 2); with --rate: the most "
                        "in flight")
    p.add_argument("--rate", type=float, default=None,
                   help="open loop: Poisson arrivals of this many requests/s (they never "
                        "fall into lockstep with the engine's steps; default: closed loop)")
    p.add_argument("--api", default="completions", choices=("completions", "chat"),
                   help="what loadgen sends: token-id completions (default) or chat "
                        "completions, one user message per prompt")
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds per run")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--interleave", action="store_true",
                   help="start each configuration's server once and alternate the runs "
                        "between them, repeat by repeat (default: a fresh server per "
                        "repeat)")
    p.add_argument("--vllm-blocks", type=int, default=150,
                   help="vLLM's KV cache in blocks of 32 tokens (default 150: 8 prompts of "
                        "512 + 32 tokens)")
    p.add_argument("--flatcake-memory-mib", type=int, default=32,
                   help="FlatCake's host memory (default 32 MiB: 2.5 such prompts)")
    p.add_argument("--flatcake-ssd-mib", type=int, default=2048)
    p.add_argument("--stop", default="server", choices=("server", "group"),
                   help="SIGTERM to the API server only, as a supervisor (default), or "
                        "SIGINT to its process group, as a terminal's Ctrl-C")
    p.add_argument("--configs", default="none,flatcake",
                   help=f"configurations, in order (of {', '.join(CONFIGS)}); the first "
                        "is the baseline of the paired ratios")
    p.add_argument("--lmcache-path", type=Path, default=None, metavar="DIR",
                   help="a folder holding the lmcache package (for --configs lmcache)")
    p.add_argument("--session-ids", action="store_true",
                   help="loadgen sends each prompt's session id")
    p.add_argument("--trace", default=None, metavar="FILE|agent",
                   help="after the working sets, one run of a trace's sessions (a trace "
                        "file, scaled to --max-model-len, or a built-in workload: "
                        f"{', '.join(TRACE_KINDS)}) on each server, named <run>-trace")
    p.add_argument("--trace-sessions", type=int, default=None,
                   help="the trace's first N sessions (default: all)")
    p.add_argument("--trace-duration", type=float, default=180.0,
                   help="measured seconds of the trace run (default 180)")
    p.add_argument("--docs-out", type=Path, default=None, metavar="FILE",
                   help="also write the tables to FILE for the docs site "
                        "(docs/results/generated/engine.md)")
    args = p.parse_args()
    configs = tuple(args.configs.split(","))
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        p.error(f"--configs: unknown {', '.join(unknown)} (of {', '.join(CONFIGS)})")
    if len(set(configs)) != len(configs):
        p.error(f"--configs: {args.configs} names a configuration twice")
    if "lmcache" in configs and not (args.lmcache_path and
                                     (args.lmcache_path / "lmcache").is_dir()):
        p.error("--configs lmcache needs --lmcache-path DIR holding the lmcache "
                "package (pip install --no-deps --target DIR lmcache)")
    if args.interleave and args.trace:
        p.error("--interleave runs every repeat on the same servers, so a trace's "
                "second replay would find its first one's KV; run --trace without "
                "--interleave")
    if args.repeats < 1:
        p.error(f"--repeats {args.repeats}: needs at least 1")
    args.configs = configs
    return args


def main() -> int:
    args = parse()
    started = docsout.start()
    if not ENGINE_PY.is_file():
        raise SystemExit(f"{ENGINE_PY} is missing: run scripts/engine_venv.sh first")
    working_sets = [int(x) for x in args.working_sets.split(",") if x]
    configs = args.configs
    args.out.mkdir(parents=True, exist_ok=True)
    build_model(args.model)
    results: list[dict] = []
    stops: list[dict] = []
    began = time.monotonic()
    loads = [*working_sets, *([None] if args.trace else [])]
    (interleaved if args.interleave else sequential)(args, configs, loads, results, stops,
                                                     began)
    how = ("each configuration's server started once and the runs alternated between "
           "them, one loaded at a time" if args.interleave
           else "a fresh server per repeat and configuration")
    text = "\n".join([
        f"# loadgen comparison, {time.strftime('%Y-%m-%d %H:%M')}", "",
        f"Working sets {args.working_sets} of {args.prompt_tokens}-token prompts + 32-token "
        f"questions, {args.max_tokens} output tokens, concurrency {args.concurrency}, "
        f"{args.duration:g} s measured after one warm-up pass; vLLM cache "
        f"{args.vllm_blocks} blocks of {BLOCK} tokens; FlatCake {args.flatcake_memory_mib} "
        f"MiB memory + {args.flatcake_ssd_mib} MiB SSD; {args.repeats} repeats, "
        f"alternating ({how}). Cells: mean (each repeat). CPU s: what each process of the "
        f"server used during the loadgen run, its warm-up included (user + system, all "
        f"threads; + LMCache's own server for lmcache)." + (
            f" Trace row: {args.trace}'s sessions from the first, {args.trace_duration:g} s, "
            "no warm-up, after the working sets on the same server." if args.trace else ""),
        "",
        table(results, working_sets, stops, configs), "",
        f"Each run against {configs[0]}'s run of the same repeat: mean [lowest - highest] "
        "(each repeat); below 1 is faster for TTFT, above 1 for req/s. The model thread's "
        "wait: seconds its vLLM worker was runnable but had no core, per run "
        "(/proc/PID/task/PID/schedstat).", "",
        paired_table(results, configs[0]), "",
        f"| server | start (s) | stop (s, {STOP_SIGNAL[args.stop]}) | worker out (s) | "
        "worker CPU s while stopping | stopped | session files |",
        "|---|---|---|---|---|---|---|",
        *(f"| {s['run']} | {s['start_s']} | {s['stop_s']} | "
          f"{'-' if s['worker_exit_s'] is None else s['worker_exit_s']} | "
          f"{'-' if s['worker_exit_cpu_s'] is None else s['worker_exit_cpu_s']} | "
          f"{'cleanly' if s['clean'] else ', '.join(s['events'])} | "
          f"{s['session_files'] if s['session_files'] is not None else '-'} |"
          for s in stops),
        "", f"total wall time {time.monotonic() - began:.0f} s; load average at the end "
        f"{loadavg()}" + (
            "; idle servers used "
            f"{max(r['idle_servers_cpu_s'] for r in results):.1f} CPU s at most during "
            "another's run" if args.interleave and results else ""), ""])
    (args.out / "compare.md").write_text(text)
    (args.out / "compare.json").write_text(json.dumps(
        {"args": {k: str(v) for k, v in vars(args).items()}, "results": results,
         "servers": stops}, indent=2))
    print(text)
    if args.docs_out:
        docsout.write(args.docs_out, ["python", "scripts/loadgen_compare.py", *sys.argv[1:]],
                      text.split("\n", 1)[1], started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
