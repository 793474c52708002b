"""The store API page's example (docs/usage/store-api.md) runs as written and checks its
own bytes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "usage" / "store-api.md"


def test_public_api_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    text = PAGE.read_text()
    code = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    monkeypatch.chdir(tmp_path)  # the example keeps its store under "."
    exec(compile(code, str(PAGE), "exec"), {"__name__": "readme_example"})
    out = capsys.readouterr().out
    assert "SSD first_turn SSD default" in out
    assert "LookupResult(num_blocks=10, num_memory_blocks=10, num_ssd_blocks=0)" in out
    assert list(tmp_path.iterdir()) == []  # the temporary store is gone
