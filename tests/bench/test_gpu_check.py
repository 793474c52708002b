"""``scripts/gpu_check.sh`` / ``flatcake.bench.gpu_check``: the CPU parts run anywhere,
the GPU paths skip cleanly without CUDA (they run on a machine with a GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flatcake.bench.gpu_check import main, run_check

REPO = Path(__file__).resolve().parents[2]


def test_without_cuda_the_gpu_paths_skip(direct_dir: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: scripts/gpu_check.sh measures it")
    lines = run_check(str(direct_dir), size_mib=8, chunk_mib=4, windows=2)
    assert lines[0].startswith("device: O_DIRECT sequential read ")
    assert lines[1:] == ["o_direct->pinned->gpu: skipped (no CUDA device)",
                         "kvikio->gpu: skipped (no CUDA device)"]
    assert list(direct_dir.iterdir()) == []  # the test file is gone


def test_script_runs_in_one_go(direct_dir: Path) -> None:
    env = dict(os.environ, PYTHON=sys.executable)
    out = subprocess.run([str(REPO / "scripts" / "gpu_check.sh"), str(direct_dir), "8"],
                         capture_output=True, text=True, env=env, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("device: O_DIRECT sequential read ")
    assert "o_direct->pinned->gpu:" in out.stdout and "kvikio->gpu:" in out.stdout


def test_bad_sizes_are_one_line_errors(direct_dir: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--dir", str(direct_dir), "--size-mib", "6", "--chunk-mib", "4"])
    assert exc.value.code == 2
    assert "--size-mib must be a positive multiple of --chunk-mib" in capsys.readouterr().err
