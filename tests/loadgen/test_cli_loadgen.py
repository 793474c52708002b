"""``flatcake loadgen`` end to end against the fake server: the files it writes, the
table, --json, and a clear one-line message (exit 2, no traceback) for a server that is
down or an option that is wrong, exit 1 when the server fails the requests."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from flatcake.cli import main
from tests.loadgen.helpers import FakeServer


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_a_working_set_run_writes_one_line_per_request(
        server: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    rc = main(["loadgen", server.url, "--working-set", "2", "--prompt-tokens", "64",
               "--suffix-tokens", "4", "--max-tokens", "3", "--vocab-size", "1000",
               "--max-requests", "6", "--concurrency", "2", "--session-ids",
               "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    recs = lines(out / "requests.jsonl")
    assert len(recs) == 6 and sorted(r["index"] for r in recs) == list(range(6))
    # First visits find nothing, revisits the whole 64-token prompt (4 full blocks).
    by_index = sorted(recs, key=lambda r: r["index"])
    assert [r["cached_tokens"] for r in by_index[:2]] == [0, 0]
    assert all(r["cached_tokens"] == 64 and r["reusable_tokens"] == 64 for r in by_index[2:])
    assert {r["session_id"] for r in recs} == {"ws-0", "ws-1"}
    assert {b["kv_transfer_params"]["session_id"] for b in server.bodies} == {"ws-0", "ws-1"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["summary"]["requests"] == 6 and summary["summary"]["errors"] == 0
    assert summary["summary"]["cached_share"] == pytest.approx(4 * 64 / (6 * 68))
    assert summary["run"]["model"] == "fake" and summary["run"]["max_model_len"] == 1024
    assert "TTFT p50 / p95 / p99" in text and "cached share" in text
    assert (out / "ttft.png").is_file()
    page = (out / "report.html").read_text()
    assert '<img src="ttft.png"' in page and "<td>TTFT p50 / p95 / p99</td>" in page
    assert "<td>cached share</td>" in page and "working set: 2 prompts" in page


def test_warmup_visits_each_prompt_once_and_is_not_measured(
        server: FakeServer, tmp_path: Path) -> None:
    out = tmp_path / "out"
    rc = main(["loadgen", server.url, "--working-set", "3", "--prompt-tokens", "64",
               "--suffix-tokens", "4", "--max-tokens", "3", "--vocab-size", "1000",
               "--max-requests", "4", "--concurrency", "2", "--warmup", "--no-plots",
               "--out", str(out)])
    assert rc == 0
    warm = lines(out / "warmup.jsonl")
    assert sorted(r["session_id"] for r in warm) == ["ws-0", "ws-1", "ws-2"]
    assert all(r["cached_tokens"] == 0 for r in warm)
    # The measured run goes on after the warm-up: every request revisits a prompt.
    recs = lines(out / "requests.jsonl")
    assert len(recs) == 4 and len(server.bodies) == 7
    assert all(r["cached_tokens"] == 64 and r["reusable_tokens"] == 64 for r in recs)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["summary"]["requests"] == 4 and summary["run"]["warmup_requests"] == 3
    # Another question on each visit: the warm-up's are not sent again.
    assert len({tuple(b["prompt"]) for b in server.bodies}) == 7


def test_json_prints_only_the_summary(server: FakeServer, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["loadgen", server.url, "--workload", "chat", "--max-requests", "5",
               "--vocab-size", "1000", "--rate", "50", "--json", "--no-plots",
               "--out", str(tmp_path)])
    got = capsys.readouterr()
    assert rc == 0
    doc = json.loads(got.out)
    assert doc["summary"]["ok"] == 5 and doc["run"]["pacing"].startswith("open loop")
    assert "workload: generated-chat" in got.err
    assert len(lines(tmp_path / "requests.jsonl")) == 5
    assert not (tmp_path / "ttft.png").exists()
    # Every prompt fits the server's context minus the output.
    assert all(len(b["prompt"]) <= 1024 - 16 for b in server.bodies)


def test_a_trace_file(server: FakeServer, tmp_path: Path) -> None:
    trace = tmp_path / "mc.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in [
        {"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 5, "input_length": 900, "output_length": 5, "hash_ids": [0, 2]}]))
    rc = main(["loadgen", server.url, "--trace", str(trace), "--vocab-size", "1000",
               "--max-model-len", "600", "--max-tokens", "4", "--out", str(tmp_path / "o"),
               "--no-plots"])
    assert rc == 0
    recs = sorted(lines(tmp_path / "o" / "requests.jsonl"), key=lambda r: r["index"])
    # 512-token blocks scaled to 298 tokens: both requests share block 0.
    assert [r["prompt_tokens_sent"] for r in recs] == [596, 596]
    assert recs[1]["reusable_tokens"] == 298 and recs[1]["cached_tokens"] == 288


def test_a_server_that_is_down_is_one_line(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = main(["loadgen", f"http://127.0.0.1:{port}", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip().splitlines() == [
        f"flatcake loadgen: error: cannot reach http://127.0.0.1:{port}/v1/models: "
        "connection refused (is the server running?)"]


def test_a_server_that_rejects_every_request(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer(vocab=100) as srv:
        rc = main(["loadgen", srv.url, "--working-set", "4", "--prompt-tokens", "32",
                   "--out", str(tmp_path), "--no-plots"])
    got = capsys.readouterr()
    assert rc == 1 and len(srv.bodies) == 3
    assert ("flatcake loadgen: error: the first 3 requests failed: HTTP 400: Token id out "
            "of vocabulary") in got.err
    assert "Traceback" not in got.err and len(lines(tmp_path / "requests.jsonl")) == 3


@pytest.mark.parametrize(("argv", "message"), [
    (["--working-set", "2", "--trace", "x"], "choose one workload"),
    (["--max-tokens", "0"], "--max-tokens must be > 0"),
    (["--duration", "-1"], "--duration must be >= 0"),
    (["--format", "mooncake"], "--format applies to --trace only"),
    (["--working-set", "2", "--prompt-tokens", "2000"], "exceed the context budget"),
    (["--trace", "/nonexistent/trace.jsonl"], "trace file not found"),
    (["--vocab-size", "2"], "vocab_size must be > 4"),
    (["--warmup"], "--warmup without N applies to --working-set only"),
    (["--warmup", "-2"], "--warmup must be >= 1"),
])
def test_option_mistakes_are_one_line(server: FakeServer, tmp_path: Path, argv: list[str],
                                      message: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["loadgen", server.url, "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0], err
    assert server.bodies == []
