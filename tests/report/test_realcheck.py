"""``flatcake.report.realcheck``: costs fitted from loadgen's records, the replay's
prediction for a case worked out by hand, the error columns, and a clear refusal of a
folder that is not a loadgen result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flatcake.report import engine_runs, realcheck

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
