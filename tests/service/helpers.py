"""A real node service (``flatcake serve`` in its own process, bounded by timeouts) and
engines attached to it: the connector's two halves without vLLM (``RemoteSchedulerSide``
+ an attached ``WorkerSide``, or one per tensor-parallel rank: ``TensorEngine``), each
with its own paged KV of random bytes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from flatcake.config import FlatCakeConfig
from flatcake.connectors.node_client import RemoteSchedulerSide
from flatcake.connectors.worker_side import WorkerSide
from flatcake.geometry import KVGeometry
from flatcake.link.client import worker_root
from flatcake.link.wire import TensorRanks
from flatcake.plan.tasks import StepPlan, WorkerReport
from tests.connectors.sides_harness import G, Harness, finish, random_kv, settings

BASE = ["store.memory_capacity_bytes=1048576", "store.ssd_capacity_bytes=67108864",
        "store.session_file_bytes=16777216", "placement.short_reply_threshold_tokens=512",
        "placement.memory_copy_watermark=0", "store.node_lease_s=2"]


# Runs the rest of its arguments with the open-file soft limit lowered to its first (and
# the hard limit too where its second is "hard").
LIMITED = ("import os, resource, sys; n = int(sys.argv[1]); "
           "hard = n if sys.argv[2] == 'hard' else resource.getrlimit(resource.RLIMIT_NOFILE)[1]; "
           "resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard)); "
           "os.execv(sys.argv[3], sys.argv[3:])")


class Service:
    """``flatcake serve`` on ``root`` in a child process (``open_files``: started with
    that open-file soft limit, as systemd's 1,024; the hard limit too with
    ``hard_open_files``)."""

    def __init__(self, root: Path, sock: Path, *extra: str,
                 env: dict[str, str] | None = None, open_files: int | None = None,
                 hard_open_files: bool = False) -> None:
        self.root, self.sock, self.extra = root, sock, extra
        self.open_files, self.hard_open_files = open_files, hard_open_files
        self.env = dict(os.environ) if env is None else env
        self.proc: subprocess.Popen[str] | None = None
        self.arena_dir = root.parent / "shm"
        self.arena_dir.mkdir(exist_ok=True)
        # Its log goes to a file: a pipe no one reads would stop a chatty service.
        self.log = root.parent / f"{root.name}-serve.log"

    def start(self) -> Service:
        cmd = [sys.executable, "-m", "flatcake.cli", "serve", "--root", str(self.root),
               "--socket", str(self.sock),
               *[x for kv in [*BASE, f"store.node_arena_dir={self.arena_dir}", *self.extra]
                 for x in ("--set", kv)]]
        if self.open_files is not None:
            cmd = [sys.executable, "-c", LIMITED, str(self.open_files),
                   "hard" if self.hard_open_files else "soft", *cmd]
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                                         env=dict(self.env, PYTHONUNBUFFERED="1"))
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith("ready:"):
                return self
            if not line and self.proc.poll() is not None:
                break
        self.stop()
        raise AssertionError(f"flatcake serve did not start: {self.stderr()}")

    def stderr(self) -> str:
        """The end of the service's log (every start of it so far)."""
        return self.log.read_text()[-3000:] if self.log.exists() else ""

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=15)

    def stop(self) -> int:
        """SIGTERM; the exit status (the test fails if it does not stop in 15 s)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc is not None else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)
            raise AssertionError("flatcake serve did not stop on SIGTERM") from None


def node_settings(sock: Path, *overrides: str) -> FlatCakeConfig:
    return settings(f"store.node=unix:{sock}", "store.node_timeout_s=1", *overrides)


class Engine(Harness):
    """One engine attached to the service at ``sock`` (same steps as ``Harness``), of
    the tenant of ``tenant_salt``, its configuration set by ``overrides`` too."""

    def __init__(self, sock: Path, seed: int, name: str = "engine",
                 tenant_salt: str = "", overrides: tuple[str, ...] = ()) -> None:
        self.s = node_settings(sock, f"engine.tenant_salt={tenant_salt}", *overrides)
        where = worker_root(str(sock), 1.0, 0, G, TensorRanks(), wait_s=10)
        self.worker = WorkerSide(G, where.config, where.store_dir,
                                 arena_path=where.arena_path)
        sched = RemoteSchedulerSide(G, self.s, name=name)
        sched.stats_every_s = 0.0  # the tests read the service's counters at once
        self.sched = sched  # type: ignore[assignment]
        self.kv = random_kv(seed)
        self.worker.register(self.kv)
        self.reports = []
        self.finished = set()
        self.released = []


class TensorEngine(Harness):
    """One engine of ``ranks.world_size`` workers attached to the service at ``sock``
    (each rank's KV of geometry ``g``); ``step`` runs every rank's part of each plan and
    reports as vLLM aggregates."""

    def __init__(self, sock: Path, ranks: TensorRanks, seed: int = 10,
                 g: KVGeometry = G) -> None:
        self.s = node_settings(sock)
        self.g = g
        sched = RemoteSchedulerSide(g, self.s, ranks=ranks, name="tp")
        sched.stats_every_s = 0.0  # the tests read the service's counters at once
        self.sched = sched  # type: ignore[assignment]
        self.workers, self.kvs = [], []
        for rank in range(ranks.world_size):
            where = worker_root(str(sock), 1.0, rank, g, ranks, wait_s=10)
            worker = WorkerSide(g, where.config, where.store_dir,
                                arena_path=where.arena_path, writes=where.writes,
                                part=where.part, parts=where.parts)
            kv = random_kv(seed + rank, g)  # each rank's KV differs
            worker.register(kv)
            self.workers.append(worker)
            self.kvs.append(kv)
        self.worker, self.kv = self.workers[0], self.kvs[0]
        self.reports, self.finished, self.released = [], set(), []  # type: ignore[var-annotated]

    def step(self) -> tuple[StepPlan, set[str], set[str], set[int]]:
        finished, self.finished = self.finished, set()
        plan = self.sched.build_step()
        for w in self.workers:
            w.start_step(plan)
            for layer in range(self.g.num_layers):
                w.wait_for_layer(layer)
            w.end_step()
        n = len(self.workers)
        sending: list[set[str]] = [set() for _ in range(n)]
        recving: list[set[str]] = [set() for _ in range(n)]
        invalid: set[int] = set()
        released: list[str] = []
        given: set[str] = set()
        deadline = time.monotonic() + 30
        while True:
            report = WorkerReport()
            for rank, w in enumerate(self.workers):
                s, r, i, rep = w.poll(finished)
                sending[rank] |= s
                recving[rank] |= r
                invalid |= i
                report = report.merged(rep)
            self.sched.on_report(report)
            # vLLM hands the scheduler a restore once every worker finished it.
            done = set.intersection(*recving) - given
            given |= done
            released.extend(self.sched.take_released(done))
            if not any(w.pending() for w in self.workers) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        self.released.extend(released)
        return plan, set.intersection(*sending), set(released), invalid

    def rank_block(self, rank: int, layer: int, slot: int) -> bytes:
        return self.kvs[rank][layer][slot].contiguous().view(torch.uint8).numpy().tobytes()

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self.sched.close()


def pause(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until it is stopped (the signal lands asynchronously)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, "the process did not stop"
        time.sleep(0.01)


def an_engine_stores(sock: Path) -> None:
    """An engine attaches to the service at ``sock`` and stores a 3-block turn (a real
    client is still served)."""
    e = Engine(sock, seed=1)
    try:
        p = finish(e, "r0", list(range(100, 113)), [5, 6, 7, 8], out=3, session="s")
        assert p["stored_blocks"] == 3
    finally:
        e.close()
