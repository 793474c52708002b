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

from flatcake.loadgen import compare as tables
from flatcake.loadgen import procstat

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


def test_cpu_seconds_are_counted_per_process_of_the_servers_group():
    with burning_worker() as pid:
        cpu = procstat.cpu_seconds(pid)
    assert cpu["worker"] >= 0.25 and cpu["engine"] == 0.0  # /proc counts whole ticks
    assert procstat.cpu_seconds(os.getpgid(0))["worker"] == 0.0  # another group


def test_the_model_threads_run_and_wait_are_read():
    with burning_worker() as pid:
        run, wait = procstat.model_thread(pid)
    assert run >= 0.25 and wait >= 0.0  # schedstat counts nanoseconds
    assert procstat.model_thread(os.getpgid(0)) == (0.0, 0.0)  # no worker in this group


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
    assert tables.stops_cell(runs, "none") == "1/2 clean, worker out in <= 6.2 s"
    assert tables.stops_cell(runs, "flatcake") == "1/1 clean"


def run(repeat: int, config: str, ws: int | None, p50: float, rps: float,
        wait: float = 0.0) -> dict:
    return {"repeat": repeat, "config": config, "working_set": ws, "model_thread_s": [9, wait],
            "summary": {"ttft_p50_s": p50, "ttft_mean_s": p50, "req_per_s": rps}}


def test_each_run_is_divided_by_the_baselines_run_of_its_repeat():
    results = [run(0, "none", 4, 0.10, 5.0, 1.0), run(0, "flatcake", 4, 0.11, 4.5, 3.0),
               run(1, "flatcake", 4, 0.30, 2.0, 5.0), run(1, "none", 4, 0.30, 2.5, 3.0),
               run(0, "none", 48, 0.50, 2.0), run(0, "flatcake", 48, 0.05, 6.0),
               run(2, "flatcake", 4, 0.1, 1.0)]  # repeat 2's baseline did not start
    rows = {row["working_set"]: row for row in tables.paired(results, "none")}
    assert rows[4]["ratios"]["ttft_p50_s"] == pytest.approx([1.1, 1.0])
    assert rows[4]["ratios"]["req_per_s"] == pytest.approx([0.9, 0.8])
    assert rows[4]["wait_s"] == [3.0, 5.0] and rows[4]["baseline_wait_s"] == [1.0, 3.0]
    assert rows[48]["ratios"]["ttft_p50_s"] == pytest.approx([0.1])
    text = tables.paired_table(results, "none")
    assert "| 4 prompts | flatcake | 1.050 [1.00 - 1.10] (1.10 / 1.00) |" in text
    line4 = next(line for line in text.splitlines() if line.startswith("| 4 prompts"))
    assert line4.endswith("| 4.0 / 2.0 |")  # the model thread's mean wait, both sides


def test_a_missing_or_zero_figure_is_left_out_of_the_ratios():
    results = [run(0, "none", 4, 0.0, 5.0), run(0, "flatcake", 4, 0.1, 5.0)]
    row = tables.paired(results, "none")[0]
    assert row["ratios"]["ttft_p50_s"] == [] and row["ratios"]["req_per_s"] == [1.0]
    assert "| 4 prompts | flatcake | - |" in tables.paired_table(results, "none")
    assert tables.paired_table([run(0, "none", 4, 0.1, 5.0)], "none") == ""


@pytest.mark.parametrize(("argv", "says"), [
    (["--interleave", "--trace", "agent"], "run --trace without --interleave"),
    (["--configs", "none,none"], "names a configuration twice"),
    (["--configs", "none,vllm"], "unknown vllm"),
    (["--repeats", "0"], "needs at least 1"),
])
def test_a_bad_command_line_says_what_is_wrong(argv, says):
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", "/nonexistent/x", *argv],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr


def test_a_cache_servers_cpu_is_shown_beside_the_engines():
    summary = {"ttft_p50_s": 0.1, "ttft_p95_s": 0.2, "cached_share": 0.5, "req_per_s": 5.0,
               "errors": 0}
    runs = [{"repeat": 0, "config": c, "working_set": 4, "summary": summary,
             "load_before": "1.0 1.0 1.0", "cpu_s": dict(
                 {"worker": 2.0, "engine": 1.0, "api": 0.5},
                 **({"cache_server": 3.0} if c == "lmcache" else {}))}
            for c in ("none", "lmcache")]
    rows = tables.table(runs, [4], [], ("none", "lmcache")).splitlines()[2:]
    assert "| 2.0 / 1.0 / 0.5 |" in rows[0]
    assert "| 2.0 / 1.0 / 0.5 + 3.0 |" in rows[1]


def test_loadgen_sends_chat_at_poisson_arrivals_when_asked(compare, monkeypatch, tmp_path):
    sent: list[list[str]] = []

    def fake_run(cmd, **kwargs):
        sent.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, '{"summary": {"requests": 1}}', "")

    monkeypatch.setattr(compare.subprocess, "run", fake_run)
    monkeypatch.setattr(sys, "argv", ["loadgen_compare.py", "--api", "chat", "--rate", "3",
                                      "--prompt-tokens", "2048"])
    args = compare.parse()
    assert compare.loadgen(args, "http://x", 4, 7, tmp_path) == {"requests": 1}
    cmd = sent[0]
    assert cmd[cmd.index("--api") + 1] == "chat" and cmd[cmd.index("--rate") + 1] == "3.0"
    assert cmd[cmd.index("--prompt-tokens") + 1] == "2048"
    monkeypatch.setattr(sys, "argv", ["loadgen_compare.py"])
    compare.loadgen(compare.parse(), "http://x", 4, 7, tmp_path)
    assert "--rate" not in sent[1] and sent[1][sent[1].index("--api") + 1] == "completions"


def test_the_null_connector_server_finds_its_module(compare, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    path = compare.env(scripts=True)["PYTHONPATH"].split(os.pathsep)
    assert str(SCRIPT.parent) in path and str(SCRIPT.parent) not in compare.env()["PYTHONPATH"]
    assert "null-connector" in compare.CONFIGS
    assert (SCRIPT.parent / "null_connector.py").is_file()


def test_the_null_connector_implements_every_hook(monkeypatch):
    pytest.importorskip("vllm", reason="vLLM is not installed here (see scripts/engine_venv.sh)")
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    module = importlib.import_module("null_connector")
    assert module.NullConnector.__abstractmethods__ == frozenset()
