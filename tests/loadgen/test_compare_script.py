"""scripts/loadgen_compare.py: every configuration gets the same cores, an unclean
stop of vLLM's own is reported, each server process's CPU seconds are counted, and
each stop says when the worker left and its CPU cost."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "loadgen_compare.py"


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("loadgen_compare", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_configuration_reserves_the_same_cores(compare, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    plain, lmcache = compare.env(), compare.env(Path("/tmp/lmc"))
    assert plain["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    assert lmcache["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"


def test_the_environment_overrides_the_reserved_cores(compare, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "3")
    assert compare.env()["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "3"


def test_a_worker_vllm_had_to_terminate_is_an_unclean_stop(compare):
    line = ("(EngineCore pid=1) WARNING 12-04 13:24:17 [multiproc_executor.py:491] [shutdown] "
            "Executor: workers still running after grace period; sending SIGTERM count=1")
    hits = [name for name, pattern in compare.STOP_EVENTS.items() if re.search(pattern, line)]
    assert hits == ["vLLM sent SIGTERM to a worker past its grace period"]


@contextlib.contextmanager
def burning_worker() -> Iterator[int]:
    """A process named as vLLM names its worker, leading its own group, that has burnt
    0.3 CPU s and waits to be stopped; yields its pid and stops it on leaving."""
    burn = ("import sys, time\n"
            "open('/proc/self/comm', 'w').write('VLLM::Worker')\n"
            "while time.process_time() < 0.3: pass\n"
            "print('done', flush=True); sys.stdin.read()\n")
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "done\n"
        yield child.pid
    finally:
        child.communicate("", timeout=30)


def test_cpu_seconds_are_counted_per_process_of_the_servers_group(compare):
    with burning_worker() as pid:
        cpu = compare.cpu_seconds(pid)
    assert cpu["worker"] >= 0.25 and cpu["engine"] == 0.0  # /proc counts whole ticks
    assert compare.cpu_seconds(os.getpgid(0))["worker"] == 0.0  # another group


def test_the_model_threads_run_and_wait_are_read(compare):
    with burning_worker() as pid:
        run, wait = compare.model_thread(pid)
    assert run >= 0.25 and wait >= 0.0  # schedstat counts nanoseconds
    assert compare.model_thread(os.getpgid(0)) == (0.0, 0.0)  # no worker in this group


def test_a_worker_that_left_at_the_deadline_is_no_unclean_stop(compare):
    line = ("(EngineCore pid=1) WARNING 12-04 14:19:31 [multiproc_executor.py:491] [shutdown] "
            "Executor: workers still running after grace period; sending SIGTERM count=0")
    assert not [name for name, pattern in compare.STOP_EVENTS.items()
                if re.search(pattern, line)]


# A server's stand-in: on SIGTERM its "worker" child (named as vLLM names it) burns 0.6
# CPU s, then both exit; the parent writes vLLM's clean-stop line to the log (the last
# sample of the worker before it leaves may miss up to a poll interval of its CPU).
FAKE_SERVER = """
import os, signal, sys, time
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.close(w)
    open('/proc/self/comm', 'w').write('VLLM::Worker')
    os.read(r, 1)
    t = time.process_time()
    while time.process_time() - t < 0.6:
        pass
    os._exit(0)
os.close(r)
signal.signal(signal.SIGTERM, lambda *_: os.close(w))
print('ready', flush=True)
os.waitpid(child, 0)
print('[shutdown] Executor: all workers exited gracefully', flush=True)
"""


def test_a_stop_says_when_the_worker_left_and_what_it_cost(compare, tmp_path):
    log = tmp_path / "server.log"
    server = object.__new__(compare.Server)
    server.log, server.lmcache = log, None
    with open(log, "wb") as out:
        server.proc = subprocess.Popen([sys.executable, "-c", FAKE_SERVER], stdout=out,
                                       start_new_session=True)
    deadline = time.monotonic() + 30
    while "ready" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    stopped = server.stop("server")
    assert stopped["rc"] == 0 and stopped["clean"] and stopped["events"] == []
    assert stopped["worker_exit_cpu_s"] >= 0.3
    assert 0 < stopped["worker_exit_s"] <= stopped["stop_s"]
    runs = [{"run": "r0-none", "clean": True, "worker_exit_s": 1.5},
            {"run": "r1-none", "clean": False, "worker_exit_s": 6.2},
            {"run": "r0-flatcake", "clean": True, "worker_exit_s": None}]
    assert compare.stops_cell(runs, "none") == "1/2 clean, worker out in <= 6.2 s"
    assert compare.stops_cell(runs, "flatcake") == "1/1 clean"
