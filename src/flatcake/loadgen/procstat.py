"""What a server's processes used, read from ``/proc``: CPU seconds by role and the
run-queue wait of the thread that runs the model (``scripts/loadgen_compare.py``).

A server runs in its own process group; its processes are told apart by name
(``comm``): vLLM's model runner ``VLLM::Worker``, its engine core ``VLLM::EngineCor``
(the scheduler, and FlatCake's scheduler half), the rest (the API server, its helpers)
counting as ``api``.
"""

from __future__ import annotations

import os
from pathlib import Path

WORKER = "VLLM::Worker"
ROLES = {WORKER: "worker", "VLLM::EngineCor": "engine"}


def model_thread(pgid: int) -> tuple[float, float]:
    """Seconds the worker's main thread (it runs the model) in process group ``pgid`` ran
    so far, and seconds it was runnable but waited for a core
    (``/proc/PID/task/PID/schedstat``); zeros when there is no worker."""
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or (proc / "comm").read_text().strip() != WORKER:
                continue
            if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            run, wait = (proc / "task" / proc.name / "schedstat").read_text().split()[:2]
            return int(run) / 1e9, int(wait) / 1e9
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return 0.0, 0.0


def loadavg() -> str:
    """The load averages over 1, 5 and 15 minutes."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def group_procs(pgid: int) -> dict[int, tuple[str, str, float]]:
    """The processes of group ``pgid``: pid -> (name, state (``Z``: exited, not yet
    reaped), CPU seconds so far, user + system, every thread)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        f = fields.split()
        if int(f[2]) == pgid:  # pgrp; utime and stime follow at 11 and 12
            out[int(proc.name)] = (name, f[0], (int(f[11]) + int(f[12])) / tick)
    return out


def cpu_seconds(pgid: int) -> dict[str, float]:
    """CPU seconds (user + system, every thread) the processes of group ``pgid`` used
    so far, by role: ``worker`` (the model runner), ``engine`` (vLLM's engine core:
    scheduler and FlatCake's scheduler half), ``api`` (the API server)."""
    out = {"worker": 0.0, "engine": 0.0, "api": 0.0}
    for name, _, cpu in group_procs(pgid).values():
        out[ROLES.get(name, "api")] += cpu
    return out
