"""``flatcake.report.realcheck``: costs fitted from loadgen's records, the replay's
prediction for a case worked out by hand, the error columns, and a clear refusal of a
folder that is not a loadgen result."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from flatcake.geometry import KVGeometry
from flatcake.replay.node.devices import layered_s
from flatcake.replay.simulate import replay_node
from flatcake.replay.workload.trace import from_requests
from flatcake.report import engine_runs, realcheck
from flatcake.report.engine_log import EngineFacts

# 2 prompts of 64 tokens (two 32-token blocks) + a 32-token question each: 96 tokens.
# The engine: 1 ms per uncached token, 0.1 ms per cached token, 10 ms per output token.
U, C, D = 1e-3, 1e-4, 1e-2


def record(i: int, prompt: int, cached: int, ttft: float) -> dict:
    # Sent 10 s apart: no request overlaps another, so no decode step is in the way.
    return {"index": i, "session_id": f"ws-{prompt}-s1", "turn": 0, "due_s": 10.0 * i,
            "sent_s": 10.0 * i, "queue_s": 0.0, "ttft_s": ttft, "e2e_s": ttft + 2 * D,
            "prompt_tokens_sent": 96, "prompt_tokens": 96, "cached_tokens": cached,
            "reusable_tokens": 64, "completion_tokens": 3, "status": 200, "error": None}


def write_run(root: Path, name: str, measured_ttft: float) -> None:
    d = root / "runs" / name
    d.mkdir(parents=True)
    warm = [record(i, i, 0, 96 * U) for i in range(2)]
    reqs = [record(i, i % 2, 64, measured_ttft) for i in range(6)]
    # A stream that broke after its status line: loadgen's summary leaves it out, and
    # so does the check (it has no TTFT to compare).
    broken = {**record(6, 0, 64, measured_ttft), "ttft_s": None,
              "error": "stream ended before [DONE]"}
    (d / "warmup.jsonl").write_text("".join(json.dumps(r) + "\n" for r in warm))
    (d / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*reqs, broken]))
    figures = {"cached_share": 64 / 96, "ttft_mean_s": measured_ttft,
               "ttft_p50_s": measured_ttft}
    (d / "summary.json").write_text(json.dumps({"summary": figures, "run": {"workload_meta": {
        "working_set": 2, "prompt_tokens": 64, "suffix_tokens": 32,
        "order": "round_robin"}}}))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    hit = 32 * U + 64 * C  # a revisit computes its question on top of 64 cached tokens
    write_run(tmp_path, "r0-none-ws2", hit)
    write_run(tmp_path, "r0-flatcake-ws2", 2 * hit)
    (tmp_path / "compare.json").write_text(json.dumps({"results": [
        {"repeat": 0, "config": "none", "working_set": 2, "load_before": "1.5 1.2 1.0"}]}))
    return tmp_path


def args(folder: Path, *more: str) -> list[str]:
    return [str(folder), "--engine-blocks", "8", "--block-tokens", "32", "--geometry",
            "2,1,16", "--memory-mib", "32", "--ssd-mib", "2048", *more]


def test_fitted_costs(folder: Path) -> None:
    costs = engine_runs.fit_costs(engine_runs.load_runs(folder))
    assert costs.uncached_s == pytest.approx(U)
    assert costs.cached_s == pytest.approx(C)
    assert costs.decode_s == pytest.approx(D)
    assert costs.requests == 8  # the no-connector run's warm-up and measured requests


def test_prediction_and_errors(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert realcheck.main(args(folder)) == 0
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0].strip("| "): line for line in out.splitlines()
            if line.startswith("| r0-")}
    # Every revisit finds its 64-token prompt (8 blocks hold both prompts): 64 / 96.
    assert "66.7 % / 66.7 % (+0.0 points)" in rows["r0-none-ws2"]
    # Unqueued, the replay charges exactly the fitted prefill: the measured TTFT.
    assert "0.038 / 0.038 (+0 %)" in rows["r0-none-ws2"]
    assert rows["r0-none-ws2"].endswith("| met | 1.5 |")  # compare.json's load
    # FlatCake's run took twice as long as the engine's costs say: -50 %, a miss, and
    # a line naming the cost the model lacks.
    assert "0.077 / 0.038 (-50 %)" in rows["r0-flatcake-ws2"]
    assert rows["r0-flatcake-ws2"].endswith("| missed | - |")
    assert "r0-flatcake-ws2: mean TTFT off; the model lacks the connector's" in out


def test_cache_too_small_predicts_no_hits(folder: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    # 4 blocks hold one request (3 blocks + its output): round robin over 2 prompts
    # finds nothing in the engine's cache, while FlatCake's store still holds both.
    assert realcheck.main([*args(folder)[:1], "--engine-blocks", "4", *args(folder)[3:]]) == 0
    out = capsys.readouterr().out
    assert "66.7 % / 0.0 % (-66.7 points)" in out
    assert "66.7 % / 66.7 % (+0.0 points)" in out


@pytest.mark.parametrize("make", ["empty", "not-json", "no-config", "no-figures"])
def test_not_a_loadgen_result(tmp_path: Path, make: str,
                              capsys: pytest.CaptureFixture[str]) -> None:
    if make == "empty":
        (tmp_path / "something.txt").write_text("hello")
        want = "holds no loadgen result folder"
    elif make == "not-json":
        d = tmp_path / "r0-none-ws2"
        d.mkdir()
        (d / "summary.json").write_text("{}")
        (d / "requests.jsonl").write_text("not json\n")
        want = "not loadgen's summary"
    elif make == "no-figures":
        write_run(tmp_path, "r0-none-ws2", 0.1)
        summary = tmp_path / "runs" / "r0-none-ws2" / "summary.json"
        doc = json.loads(summary.read_text())
        doc["summary"]["cached_share"] = None  # the server reported no cached tokens
        summary.write_text(json.dumps(doc))
        want = "no measured figures (summary.cached_share"
    else:
        d = tmp_path / "results"
        d.mkdir()
        (d / "summary.json").write_text("{}")
        (d / "requests.jsonl").write_text("")
        want = "the name does not say the configuration"
    assert realcheck.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert want in err and "Traceback" not in err


def trace_run(records: list[dict], block_tokens: int) -> engine_runs.Run:
    return engine_runs.Run("r0-none-trace", "none", None, records, [], {}, block_tokens)


def sent(i: int, blocks: list[list[int]], tokens: int) -> dict:
    return {"index": i, "sent_s": float(i), "blocks": blocks, "prompt_tokens_sent": tokens,
            "prompt_tokens": tokens, "completion_tokens": 2}


def test_trace_blocks_become_the_engines_blocks() -> None:
    # Loadgen blocks of 8 tokens, engine blocks of 32: request 1 extends request 0's 5
    # blocks (40 tokens) to 9 (72 tokens) + 3 tokens of its own; request 2 shares only
    # the first 3 blocks (24 tokens: less than an engine block) with them.
    run = trace_run([sent(0, [[10, 15]], 40), sent(1, [[10, 19]], 75),
                     sent(2, [[10, 13], [50, 52]], 40)], 8)
    reqs = realcheck.engine_requests(run, 32)
    first, second, third = (blocks for _, blocks, _, _ in reqs)
    assert len(first) == 2 and len(second) == 3 and len(third) == 2  # ceil(tokens / 32)
    assert second[0] == first[0]  # the 32 tokens of ids 10..13
    assert second[1] not in first  # tokens 32..63 were never sent before
    assert first[1] >= 1 << 40  # request 0's tokens 32..39: a partial block, never shared
    assert second[2] >= 1 << 40  # tokens 64..74 reach into request 1's own tail
    assert third[0] not in first + second  # ids 50, 51 change tokens 24..31


def test_a_whole_prompt_is_never_all_served() -> None:
    # 64 tokens sent twice: vLLM computes the last token, so only block 0 is shared.
    run = trace_run([sent(0, [[1, 3]], 64), sent(1, [[1, 3]], 64)], 32)
    (_, a, _, _), (_, b, _, _) = realcheck.engine_requests(run, 32)
    assert a[0] == b[0] and a[1] != b[1]


def test_working_set_prompt_is_one_loadgen_block() -> None:
    # A working-set visit: one id of 512 tokens + a 32-token question: 16 shared blocks.
    run = trace_run([sent(0, [[7, 8]], 544), sent(1, [[7, 8]], 544)], 512)
    (_, a, _, _), (_, b, _, _) = realcheck.engine_requests(run, 32)
    assert a[:16] == b[:16] and len(set(a[:16])) == 16 and a[16] != b[16]


def in_step_replay(in_step: bool) -> tuple[list[float], dict[str, float], realcheck.Engine]:
    """An SSD hit replayed by hand: 4 layers of 16,384 B blocks, GPU cache 4 blocks, no
    FlatCake memory. A (3 blocks), then B evicts A from the GPU, then A's first 2
    blocks (32,768 B) come back from SSD. The disk reads them in 0.07 s, plus 0.01 s of
    fixed cost per restore; the prefill of 32 new tokens on 64 cached ones is
    32 * 1 ms + 64 * 0.1 ms = 0.0384 s."""
    g = KVGeometry(num_layers=4, tokens_per_block=32, num_kv_heads=1, head_dim=16,
                   dtype="float32", name="engine")
    engine = realcheck.Engine(EngineFacts(4, 32, g, "test", ssd_loads_in_step=in_step),
                              0, 2048 << 20)
    preset = realcheck.build_preset(engine_runs.Costs(U, C, D, 1), engine, None)
    ssd = dataclasses.replace(preset.node.ssd, read_bytes_per_s=32768 / 0.07,
                              command_latency_s=0.0)
    preset = preset.with_node(ssd=ssd, restore_overhead_s=0.01, store_command_s=0.0)
    wl = from_requests([(0.0, [0, 1, 2], 96, 1), (10.0, [3, 4, 5], 96, 1),
                        (20.0, [0, 1, 6], 96, 1)], 32)
    _, node = replay_node(wl, "flatcake", 1.0, preset)
    rec = node.rec
    assert list(rec.hit_blocks) == [0, 0, 2] and rec.ssd_read_bytes == 32768
    pred = {"mean": 0.2, "ssd_bytes": float(rec.ssd_read_bytes)}
    return list(rec.first_token_s - rec.arrival_s), pred, engine


def test_an_ssd_hit_loaded_in_the_step_overlaps_the_forward_layer_by_layer() -> None:
    # Restored before the step: 0.07 + 0.01 + 0.0384 = 0.1184 s.
    before, _, _ = in_step_replay(False)
    assert before[2] == pytest.approx(0.1184)
    # In the step, 4 layers: each layer's 0.02 s load, then the last layer's forward
    # (0.0384 / 4 = 0.0096 s) after the last load: 0.08 + 0.0096 = 0.0896 s.
    during, _, _ = in_step_replay(True)
    assert during[2] == pytest.approx(0.0896)
    assert before[:2] == during[:2] == pytest.approx([0.096, 0.096])  # misses alike


def test_layered_load_and_forward() -> None:
    assert layered_s(1.2, 0.6, 12) == pytest.approx(1.2 + 0.05)  # the load is longer
    assert layered_s(0.6, 1.2, 12) == pytest.approx(1.2 + 0.05)  # the forward is
    # A decode step of 0.5 s in progress: the loads are ready before it ends.
    assert layered_s(0.12, 1.2, 12, wait_s=0.5) == pytest.approx(1.7)
    with pytest.raises(ValueError, match="layers must be >= 1"):
        layered_s(1.0, 1.0, 0)


def test_an_over_prediction_names_the_restore_charged_before_the_prefill(
        folder: Path) -> None:
    run = next(r for r in engine_runs.load_runs(folder) if r.config == "flatcake")
    costs = engine_runs.Costs(U, C, D, 1)
    _, pred, engine = in_step_replay(False)
    meas = {"mean": 0.1, "p50": 0.1}
    why = realcheck.lacks(run, meas, pred, [run], costs, engine.facts.ssd_loads_in_step)
    assert "restores each SSD hit before the prefill starts" in why
    assert "fitted prefill cost" not in why
    # Modelled in the step, an over-prediction is the fitted cost's.
    why = realcheck.lacks(run, meas, pred, [run], costs, True)
    assert "fitted prefill cost is too high" in why
