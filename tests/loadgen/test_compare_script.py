"""scripts/loadgen_compare.py: every configuration gets the same cores, an unclean
stop of vLLM's own is reported, and each server process's CPU seconds are counted."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
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


def test_cpu_seconds_are_counted_per_process_of_the_servers_group(compare):
    # A "worker" of the group burns 0.3 CPU s, then waits to be stopped.
    burn = ("import sys, time\n"
            "open('/proc/self/comm', 'w').write('VLLM::Worker')\n"
            "while time.process_time() < 0.3: pass\n"
            "print('done', flush=True); sys.stdin.read()\n")
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "done\n"
        cpu = compare.cpu_seconds(child.pid)
    finally:
        child.communicate("", timeout=30)
    assert cpu["worker"] >= 0.25 and cpu["engine"] == 0.0  # /proc counts whole ticks
    assert compare.cpu_seconds(os.getpgid(0))["worker"] == 0.0  # another group


def test_the_model_threads_run_and_wait_are_read(compare):
    burn = ("import sys, time\n"
            "open('/proc/self/comm', 'w').write('VLLM::Worker')\n"
            "while time.process_time() < 0.3: pass\n"
            "print('done', flush=True); sys.stdin.read()\n")
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "done\n"
        run, wait = compare.model_thread(child.pid)
    finally:
        child.communicate("", timeout=30)
    assert run >= 0.25 and wait >= 0.0  # schedstat counts nanoseconds
    assert compare.model_thread(os.getpgid(0)) == (0.0, 0.0)  # no worker in this group
