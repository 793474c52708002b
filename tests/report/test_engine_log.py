"""``report.engine_log`` and realcheck's trace replay on files recorded from a real run:
``scripts/loadgen_compare.py --working-sets 4,32 --trace <Claude Code trace>
--trace-sessions 8`` against vLLM CPU 0.32 (the random 12-layer model), cut down to the
server logs' three lines that matter, the model's config.json, each run's first 8
requests (their summary figures recomputed for those 8) and compare.json's entries for
the runs kept (``fixtures/realengine``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flatcake.connectors.settings import IN_STEP_LINE
from flatcake.report import engine_runs, realcheck
from flatcake.report.engine_log import read_engine

FIXTURE = Path(__file__).parent / "fixtures" / "realengine"
RECORDED_MODEL = "/tmp/flatcake-loadgen-model"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """The fixture with its logs naming the model folder where the copy put it."""
    root = tmp_path / "lgc"
    shutil.copytree(FIXTURE, root)
    for log in root.glob("server-*.log"):
        log.write_text(log.read_text().replace(RECORDED_MODEL, str(root / "model")))
    return root


def test_the_engine_from_its_log_and_config(folder: Path) -> None:
    none = read_engine(folder / "server-r0-none.log")
    assert (none.cache_blocks, none.block_tokens) == (150, 32)  # 4,800 tokens / 32
    g = none.geometry
    assert (g.num_layers, g.num_kv_heads, g.head_dim, g.dtype) == (12, 4, 64, "float32")
    assert g.bytes_per_token == 24_576 and g.tokens_per_block == 32
    assert none.flatcake_memory_bytes is None and none.flatcake_ssd_bytes is None
    fc = read_engine(folder / "server-r0-flatcake.log")  # its KV transfer config
    assert (fc.flatcake_memory_bytes, fc.flatcake_ssd_bytes) == (32 << 20, 2048 << 20)
    # A CPU engine's connector loads SSD hits in the step unless its config says not.
    assert fc.ssd_loads_in_step and not none.ssd_loads_in_step
    log = folder / "server-r0-flatcake.log"
    log.write_text(log.read_text().replace("'ssd_capacity_bytes': 2147483648",
                                           "'ssd_capacity_bytes': 2147483648, "
                                           "'ssd_loads_in_step': False"))
    off = read_engine(log)
    assert not off.ssd_loads_in_step and "False in the log" in off.in_step_source


def test_the_connectors_own_line_says_whether_ssd_hits_load_in_the_step(
        folder: Path) -> None:
    # The config sets nothing (the default would be True on this CPU engine), but the
    # connector said what it does: its line is read first.
    log = folder / "server-r0-flatcake.log"
    said = IN_STEP_LINE % (False, "several KV cache groups: every load is async")
    log.write_text(log.read_text() + f"(EngineCore pid=7) INFO 12-04 20:54:36 "
                                      f"[vllm.py:250] {said}\n")
    facts = read_engine(log)
    assert not facts.ssd_loads_in_step
    assert "the connector's log: several KV cache groups" in facts.in_step_source


def test_a_log_without_the_cache_line(folder: Path) -> None:
    log = folder / "server-r0-none.log"
    log.write_text("\n".join(x for x in log.read_text().splitlines()
                             if "KV cache size" not in x))
    with pytest.raises(ValueError, match="no 'KV cache size: N tokens' line"):
        read_engine(log)


def test_a_log_without_block_size(folder: Path) -> None:
    log = folder / "server-r0-none.log"
    log.write_text(log.read_text().replace("'block_size': 32, ", "")
                   .replace("num_gpu_blocks_override=150", ""))
    with pytest.raises(ValueError, match="names no block size"):
        read_engine(log)


def test_a_model_that_is_not_a_local_folder(folder: Path) -> None:
    (folder / "model" / "config.json").unlink()
    with pytest.raises(ValueError, match=r"config.json: cannot read the model's config"):
        read_engine(folder / "server-r0-none.log")
    assert realcheck.main([str(folder)]) == 2


def test_no_log_and_no_flags(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for log in folder.glob("server-*.log"):
        log.unlink()
    assert realcheck.main([str(folder)]) == 2
    err = capsys.readouterr().err
    assert "no server log beside it" in err and "--engine-blocks" in err
    assert "Traceback" not in err


def test_trace_runs_are_replayed(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = {r.name: r for r in engine_runs.load_runs(folder)}
    assert runs["r0-none-trace"].working_set is None
    assert runs["r0-none-trace"].block_tokens == 1  # the trace scaled to 1,008 tokens
    trace = runs["r0-none-trace"]  # compare.json: its load, its model thread's schedstat
    assert trace.load == "9.48"
    assert trace.stretch == pytest.approx(1 + 13.324 / 137.69)
    assert trace.worker_cpu_s == pytest.approx(140.19)
    assert realcheck.main([str(folder)]) == 0
    out = capsys.readouterr().out
    assert "150 blocks of 32 tokens, 12 layers x 4 KV heads x 64 float32" in out
    assert ("FlatCake 32 MiB memory + 2048 MiB SSD, SSD hits loaded in the step (CPU KV "
            "cache, ssd_loads_in_step not set: the connector's default True) (from "
            "server-r0-flatcake.log)") in out
    rows = {line.split(" | ")[0].strip("| "): line for line in out.splitlines()
            if line.startswith("| r0-")}
    # The replay gives the engine's cached share of the trace's first requests exactly:
    # what the server reported (69.7 %), from the blocks the records name.
    assert "| trace | 8 | 69.7 % / 69.7 % (+0.0 points)" in rows["r0-none-trace"]
    assert "| trace | 8 | 69.7 % / 69.7 % (+0.0 points)" in rows["r0-flatcake-trace"]
    assert "| 4 prompts | 8 | 94.1 % / 94.1 % (+0.0 points)" in rows["r0-none-ws4"]
    assert "| 0.10 s/s |" in rows["r0-none-trace"]  # the engine's measured CPU wait
