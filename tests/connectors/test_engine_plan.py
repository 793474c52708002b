"""The engine tests' script refuses a plan that does not say whether vLLM's own prefix
cache is on: left to a default, a run that checks FlatCake's hits could have vLLM keep
the prefix itself, and FlatCake would rightly load nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.connectors.engine_script import read_plan

SCRIPT = Path(__file__).with_name("engine_script.py")


def plan(tmp_path: Path, **options: object) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"phases": [[{"name": "A0", "prompt": [5, 6],
                                             "max_tokens": 1}]]} | options))
    return path


@pytest.mark.parametrize("options", [{}, {"prefix_caching": "yes"}, {"prefix_caching": None}])
def test_a_plan_must_say_whether_vllms_prefix_cache_is_on(tmp_path: Path,
                                                           options: dict) -> None:
    with pytest.raises(SystemExit, match='must set "prefix_caching" to true or false'):
        read_plan(str(plan(tmp_path, **options)))


@pytest.mark.parametrize("on", [True, False])
def test_a_plan_that_says_it_is_read(tmp_path: Path, on: bool) -> None:
    assert read_plan(str(plan(tmp_path, prefix_caching=on)))["prefix_caching"] is on


def test_the_script_refuses_it_by_name_before_starting_an_engine(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "serve", str(tmp_path / "model"),
                           str(plan(tmp_path)), str(tmp_path / "out.json")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert 'must set "prefix_caching"' in proc.stderr
    assert not (tmp_path / "model").exists() and not (tmp_path / "out.json").exists()
