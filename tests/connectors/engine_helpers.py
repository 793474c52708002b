"""Running one vLLM engine process over a plan of requests (``engine_script.py``) and
comparing what it served: shared by the engine tests of the vLLM connector. Importing it
skips the importing test module where vLLM is not installed."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (see scripts/engine_venv.sh)")

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


def random_ids(seed: int) -> Callable[[int], list[int]]:
    """``ids(n)``: ``n`` random token ids of the test models' 512-token vocabulary, past
    its special ids; the same sequence of calls gives the same ids for a seed."""
    rng = random.Random(seed)
    return lambda n: [rng.randrange(3, 512) for _ in range(n)]


def session_turns(ids: Callable[[int], list[int]], session: str, *lengths: int,
                  **fields: object) -> dict[str, dict]:
    """Turns ``<session>0``, ``<session>1``, ... of one session: a prompt of
    ``lengths[0]`` token ids from ``ids``, then each turn the previous one's prompt and
    reply extended by ``lengths[k]`` more; ``fields`` (``max_tokens``...) go with every
    turn, ``session_id`` is the session's name unless ``fields`` set it."""
    fields = {"session_id": session} | fields
    turns = {f"{session}0": {"prompt": ids(lengths[0]), **fields}}
    for k, n in enumerate(lengths[1:], 1):
        turns[f"{session}{k}"] = {"extend": [f"{session}{k - 1}", ids(n)], **fields}
    return turns


def plan_of(turns: dict[str, dict], *groups: tuple[str, ...], prefix_caching: bool,
            **options: object) -> dict:
    """An engine run's plan: each group of ``turns``' named requests is one phase (sent
    together), the phases in order; ``prefix_caching`` says whether vLLM's own prefix
    cache is on (off where FlatCake's hits are checked: vLLM would keep the prefix
    itself); ``options`` set the run (``engine_script.py``)."""
    return {"phases": [[{"name": n, **turns[n]} for n in g] for g in groups],
            "prefix_caching": prefix_caching} | options


def run_as_served(model: Path, plan: dict, want: dict, out: Path,
                  store: Path) -> tuple[dict, dict, dict]:
    """A FlatCake run of ``plan`` with every prompt as the baseline served it, each
    output equal to the baseline's (``want``); returns what the run served, its requests
    by name, and each request's FlatCake figures by name."""
    run = run_engine(model, explicit(plan, want), out, store)
    got = run["requests"]
    fc = {name: got[name]["flatcake"] for name in got}
    print(f"{out.stem}:", json.dumps(fc, indent=1))
    for name in got:
        same_output(got[name], want[name], plan.get("dtype", "float32"))
    return run, got, fc


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


# How far a logprob may move between two runs of the same prompt on the same KV: the
# engine's kernels reduce in an order that depends on the batch (which requests ran
# together, how a prompt was split in chunks), so a run with restored KV and the
# baseline may differ in the last bits of the logits. float32 models: 1e-5. bfloat16
# models: 0.02, about five units of bfloat16's last place between 0.5 and 1 (2**-8 =
# 0.0039; the random test models' logprobs sit near -ln(vocab)): a CPU with AMX, whose
# bfloat16 kernels tile by batch, was seen at one unit (0.0039) on a Qwen3-Next whose
# state checkpoint was restored into a batch of two where the baseline ran one. The
# tokens must be equal either way, and the tests check every load's counts themselves.
LOGPROB_TOLERANCE = {"float32": 1e-5, "bfloat16": 0.02}


def same_output(got: dict, want: dict, dtype: str = "float32") -> None:
    assert got["prompt"] == want["prompt"]
    assert got["tokens"] == want["tokens"]
    worst = max((abs(a - b) for a, b in zip(got["logprobs"], want["logprobs"], strict=True)),
                default=0.0)
    assert got["logprobs"] == pytest.approx(want["logprobs"], abs=LOGPROB_TOLERANCE[dtype]), \
        f"logprobs differ by up to {worst:.3g} ({dtype})"


# The tiny Qwen3-Next of the state tests (embedded and through the node service).
STATE_BLOCK = 256  # vLLM's attention block for this model: a page holds one state
OPTIONS = {"model_kind": "qwen3_next", "dtype": "bfloat16", "block_size": None,
           "short_reply_threshold_tokens": 0}


def state_turns() -> dict[str, dict]:
    """Sessions H (two turns), R (one: H's first 512 tokens as its system prompt) and C
    (two turns), each turn ending past its last 256-token state checkpoint."""
    ids = random_ids(5)
    system = ids(2 * STATE_BLOCK)
    return {"H0": {"prompt": system + ids(88), "session_id": "H", "max_tokens": 8},
            "H1": {"extend": ["H0", ids(100)], "session_id": "H", "max_tokens": 8},
            "R0": {"prompt": system + ids(60), "session_id": "R", "max_tokens": 8},
            "C0": {"prompt": ids(600), "session_id": "C", "max_tokens": 8},
            "C1": {"extend": ["C0", ids(50)], "session_id": "C", "max_tokens": 8}}
