"""``flatcake bench --connector``: the scheduler half driven through vLLM's hooks, books
only. What each kind of request does is counted (digests, stores, loads); the CPU figures
are printed by the bench, never asserted."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from flatcake.bench.connector import SETTINGS, ConnectorBenchOptions, Driver
from flatcake.cli import main
from flatcake.config import load_config
from flatcake.connectors.scheduler_side import SchedulerSide
from flatcake.geometry import preset


def test_the_driver_stores_a_new_prompt_once_and_a_held_one_never(tmp_path: Path) -> None:
    g = preset("llama-3.1-8b")
    side = SchedulerSide(g, load_config(env={}, overrides=SETTINGS), tmp_path)
    d = Driver(side, g.tokens_per_block, g.name)
    rng = random.Random(0)
    prompt = [rng.randbytes(32) for _ in range(64)]
    d.request(prompt, 0)  # new: a miss, stored
    assert side.totals()["stores_ok"] == 1 and d.keys.num_hashed == 64
    for _ in range(3):  # vLLM holds every block: nothing loaded, stored or hashed
        d.request(prompt, 64)
    d.request(prompt, 0)  # FlatCake's hit: loaded from SSD, not stored again
    totals = side.totals()
    assert totals["stores_ok"] == 1 and d.keys.num_hashed == 64
    assert totals["loaded_tokens_ssd"] == 64 * g.tokens_per_block
    side.close()


def test_connector_rows_run_and_report(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    md = tmp_path / "connector.md"
    assert main(["bench", "--connector", "--quick", "--dir", str(tmp_path), "--json",
                 "--docs-out", str(md)]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {(c["half"], c["case"]) for c in doc["costs"]}
    assert rows == {(h, c) for h in ("embedded", "node service")
                    for c in ("new", "held", "hit", "idle step")}
    assert all(c["total_us"] > 0 for c in doc["costs"] if c["half"] == "embedded")
    assert "--prompt-blocks 8" in doc["command"] and "| bar |" in md.read_text()
    assert not list(tmp_path.glob("flatcake-connector-bench-*"))  # cleaned up


def test_bad_options_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["bench", "--connector", "--prompt-blocks", "8,x", "--dir",
                 str(tmp_path)]) == 2
    assert "--prompt-blocks must be ints" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--requests must be an int >= 1"):
        ConnectorBenchOptions(str(tmp_path), requests=0)
