"""Running one vLLM engine process over a plan of requests (``engine_script.py``) and
comparing what it served: shared by the engine tests of the vLLM connector."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("engine_script.py")
BLOCK = 32


def engine_env() -> dict[str, str]:
    return dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                VLLM_CPU_KVCACHE_SPACE="1")


def run_engine(model: Path, plan: dict, out: Path, store: Path | None = None) -> dict:
    """One engine process (fresh interpreter); returns what it served."""
    plan_path = out.with_suffix(".plan.json")
    plan_path.write_text(json.dumps(plan))
    cmd = [sys.executable, str(SCRIPT), "serve", str(model), str(plan_path), str(out)]
    if store is not None:
        cmd.append(str(store))
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=engine_env(), capture_output=True, text=True, timeout=480)
    if proc.returncode != 0:
        raise AssertionError(f"engine process failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    result = json.loads(out.read_text())
    result["process_s"] = round(time.monotonic() - t0, 1)
    result["log"] = proc.stdout + proc.stderr
    print(f"{out.stem}: process {result['process_s']} s, engine start "
          f"{result['started_s']:.1f} s, phases {result['phase_s']}")
    return result


def explicit(plan: dict, served: dict) -> dict:
    """``plan`` with every prompt spelled out as the baseline served it."""
    phases = [[{k: v for k, v in req.items() if k != "extend"}
               | {"prompt": served[req.get("as", req["name"])]["prompt"]} for req in phase]
              for phase in plan["phases"]]
    return plan | {"phases": phases}


def corrupt_session_file(store: Path, session_id: str) -> Path:
    """Flip bytes inside the first segment's layer data of ``session_id``'s file."""
    from flatcake.cio.format import FILE_HEADER_BYTES, decode_file_header

    for path in sorted((store / "sessions").iterdir()):
        with open(path, "rb") as fh:
            header = decode_file_header(fh.read(FILE_HEADER_BYTES))
        if header.session_id == session_id:
            data = bytearray(path.read_bytes())
            pos = FILE_HEADER_BYTES + 4096 + 1000  # past the segment header, in layer 0
            data[pos:pos + 8] = bytes(b ^ 0x5A for b in data[pos:pos + 8])
            path.write_bytes(bytes(data))
            return path
    raise AssertionError(f"no session file holds session {session_id!r}")


def same_output(got: dict, want: dict) -> None:
    assert got["prompt"] == want["prompt"]
    assert got["tokens"] == want["tokens"]
    assert got["logprobs"] == pytest.approx(want["logprobs"], abs=1e-5)
