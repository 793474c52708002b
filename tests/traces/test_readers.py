"""Readers on tiny hand-written files: mapping to the model, detection, every error path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flatcake.traces import (
    SESSION_SHIFT,
    TraceFormatError,
    detect_format,
    generate_workload,
    read_trace,
    write_native,
)
from flatcake.traces.generator import WorkloadSpec

Writer = Callable[..., Path]
NS = 1 << SESSION_SHIFT


def _cc_session(name: str = "s1", **overrides: Any) -> dict[str, Any]:
    session: dict[str, Any] = {
        "id": name, "models": 1, "block_size": 4, "hash_id_scope": "local",
        "tool_tokens": 3, "system_tokens": 5,
        "requests": [
            {"t": 0.0, "type": "n", "in": 9, "out": 2, "think_time": 0.0, "hash_ids": [1, 2]},
            {"t": 10.0, "type": "subagent", "agent_id": "ag1", "subagent_type": "Explore",
             "requests": [
                 {"t": 0.0, "type": "n", "in": 4, "out": 1, "hash_ids": [7]},
                 {"t": 30.0, "type": "s", "in": 8, "out": 1, "hash_ids": [7, 8]},
             ]},
            {"t": 20.0, "type": "s", "in": 12, "out": 3, "think_time": 5.0,
             "hash_ids": [1, 2, 3]},
        ],
    }
    session.update(overrides)
    return session


def _cc_small(name: str) -> dict[str, Any]:
    return {"id": name, "block_size": 4, "hash_id_scope": "local",
            "requests": [{"t": 0, "type": "n", "in": 5, "out": 1, "hash_ids": [1]}]}


# ---------------------------------------------------------------- Claude Code
@pytest.mark.parametrize("gz", [False, True])
def test_claude_code_sessions_subagents_and_namespacing(write_lines: Writer, gz: bool) -> None:
    path = write_lines("cc.jsonl" + (".gz" if gz else ""), [_cc_session(), _cc_small("s2")],
                       gz=gz)
    assert detect_format(path) == "claude-code"
    tr = read_trace(path)
    assert (tr.clock, tr.block_size_tokens, tr.partial_last_block) == ("session", 4, False)
    assert tr.session_names == ("s1", "s2")
    assert tr.session_prefix_tokens.tolist() == [8, -1]
    # Sub-agent requests sit at spawn t + own t, merged into the session's time order.
    assert tr.time_s.tolist() == [0.0, 10.0, 20.0, 40.0, 0.0]
    assert tr.agent.tolist() == [0, 1, 0, 1, 0]
    assert tr.turn.tolist() == [0, 0, 1, 1, 0]
    assert tr.session.tolist() == [0, 0, 0, 0, 1]
    assert tr.input_tokens.tolist() == [9, 4, 12, 8, 5]
    assert tr.output_tokens.tolist() == [2, 1, 3, 1, 1]
    assert np.isnan(tr.think_time_s[1]) and tr.think_time_s[2] == 5.0
    # Local ids: session 0 keeps them, session 1 is shifted into its own namespace.
    assert tr.blocks(2).tolist() == [1, 2, 3]
    assert tr.blocks(3).tolist() == [7, 8]
    assert tr.blocks(4).tolist() == [NS | 1]
    sub = tr.subagents[0]
    assert (sub.session, sub.agent, sub.parent_agent, sub.spawn_time_s, sub.name, sub.kind) \
        == (0, 1, 0, 10.0, "ag1", "Explore")


def _bad_request(**fields: Any) -> dict[str, Any]:
    req = {"t": 0.0, "type": "n", "in": 8, "out": 1, "hash_ids": [1, 2]}
    req.update(fields)
    return {"id": "bad", "block_size": 4, "requests": [req]}


@pytest.mark.parametrize(
    ("line", "field"),
    [
        (b'{"id": "x", "requests": [', "<json>"),
        ({"id": "x", "requests": []}, "block_size"),
        ({"id": "x", "block_size": 4}, "requests"),
        ({"id": "x", "block_size": 4, "hash_id_scope": "weird", "requests": []},
         "hash_id_scope"),
        (_bad_request(**{"in": None}), "requests[0].in"),
        (_bad_request(out=-3), "requests[0].out"),
        (_bad_request(t="soon"), "requests[0].t"),
        (_bad_request(**{"in": True}), "requests[0].in"),
        (_bad_request(hash_ids=[1, 2, 3]), "requests[0].hash_ids"),
        (_bad_request(hash_ids=[1, "2"]), "requests[0].hash_ids"),
        (_bad_request(hash_ids=[[1], [2]]), "requests[0].hash_ids"),
        (_bad_request(hash_ids=[1, 2.5]), "requests[0].hash_ids"),
        (_bad_request(hash_ids=[-1, 2]), "requests[0].hash_ids"),
        (_bad_request(hash_ids=[1, 2**40]), "requests[0].hash_ids"),
        (_bad_request(hash_ids=7), "requests[0].hash_ids"),
        (_bad_request(think_time=-1), "requests[0].think_time"),
        ({"id": "x", "block_size": 4, "requests": [
            {"t": 1, "type": "subagent", "requests": [{"t": 0, "in": 4, "hash_ids": [1]}]}]},
         "requests[0].requests[0].out"),
        ({"id": "x", "block_size": 8, "requests": []}, "block_size"),
    ],
)
def test_claude_code_errors_name_file_line_and_field(write_lines: Writer, line: Any,
                                                     field: str) -> None:
    path = write_lines("cc.jsonl", [_cc_small("ok"), line])
    with pytest.raises(TraceFormatError) as info:
        read_trace(path, format="claude-code")
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), 2, field)
    assert f"{path}:2: field {field!r}" in str(err)


def test_claude_code_skip_bad_counts_dropped_sessions(write_lines: Writer) -> None:
    path = write_lines("cc.jsonl", [_cc_small("a"), b"{oops", _cc_small("b"),
                                    _bad_request(out=-1), b"", _cc_small("c")])
    tr = read_trace(path, skip_bad=True)
    assert tr.session_names == ("a", "b", "c")
    assert tr.num_skipped_lines == 2
    assert len(tr.skipped_examples) == 2 and ":2:" in tr.skipped_examples[0]
    # Namespaces follow kept sessions: "c" is session 2.
    assert tr.blocks(2).tolist() == [2 * NS | 1]


# ---------------------------------------------------------------- Mooncake
def _mc(t: int, n_in: int, ids: list[int], out: int = 10) -> dict[str, Any]:
    return {"timestamp": t, "input_length": n_in, "output_length": out, "hash_ids": ids}


def test_mooncake_global_clock_partial_blocks_and_order(write_lines: Writer) -> None:
    path = write_lines("mc.jsonl", [_mc(3000, 1025, [0, 1, 2]), _mc(1000, 512, [0]),
                                    _mc(3000, 1, [5])], gz=True)
    assert detect_format(path) == "mooncake"
    tr = read_trace(path)
    assert (tr.clock, tr.block_size_tokens, tr.partial_last_block) == ("global", 512, True)
    # Stable sort by timestamp; time counts from the first request, in seconds.
    assert tr.time_s.tolist() == [0.0, 2.0, 2.0]
    assert tr.input_tokens.tolist() == [512, 1025, 1]
    assert [tr.blocks(i).tolist() for i in range(3)] == [[0], [0, 1, 2], [5]]
    assert tr.num_sessions == 0 and tr.session.tolist() == [-1, -1, -1]


@pytest.mark.parametrize(
    ("line", "field"),
    [
        (b"not json", "<json>"),
        (b"[1, 2]", "<record>"),
        ({"input_length": 10, "output_length": 1, "hash_ids": [1]}, "timestamp"),
        (_mc(0, -5, []), "input_length"),
        (_mc(0, 10, [1], out=-1), "output_length"),
        (_mc(0, 1000, [1]), "hash_ids"),
        (_mc(0, 10, [1, 2]), "hash_ids"),
        ({"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]},
         "timestamp"),
        (_mc(0, 10, ["a"]), "hash_ids"),
    ],
)
def test_mooncake_errors(write_lines: Writer, line: Any, field: str) -> None:
    path = write_lines("mc.jsonl", [_mc(0, 10, [1]), line])
    with pytest.raises(TraceFormatError) as info:
        read_trace(path, format="mooncake")
    assert (info.value.line, info.value.field) == (2, field)


def test_mooncake_skip_bad(write_lines: Writer) -> None:
    path = write_lines("mc.jsonl", [_mc(0, 10, [1]), _mc(1, 10, [1, 2]), _mc(2, 10, [1])])
    tr = read_trace(path, skip_bad=True)
    assert tr.num_requests == 2 and tr.num_skipped_lines == 1


# ---------------------------------------------------------------- Azure
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_azure_lengths_only(write_lines: Writer) -> None:
    path = write_lines("az.csv", AZURE_HEADER + "2023-11-16 18:17:03.9799600,4808,10\n"
                       "2023-11-16 18:17:04.0319600,3180,8\n\n"
                       "2023-11-16 18:17:03.5,100,1\n")
    assert detect_format(path) == "azure"
    tr = read_trace(path)
    assert not tr.has_hashes and tr.num_block_accesses == 0
    assert tr.input_tokens.tolist() == [100, 4808, 3180]
    assert tr.output_tokens.tolist() == [1, 10, 8]
    assert tr.time_s == pytest.approx([0.0, 0.47996, 0.53196])
    assert tr.start_unix_s == pytest.approx(1700158623.5)


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ("time,in,out\n", 1, "<header>"),
        (AZURE_HEADER + "2023-11-16 18:17:03,10\n", 2, "<row>"),
        (AZURE_HEADER + "yesterday,10,1\n", 2, "TIMESTAMP"),
        (AZURE_HEADER + "2023-11-16 18:17:03.x,10,1\n", 2, "TIMESTAMP"),
        (AZURE_HEADER + "2023-11-16 18:17:03,1.5,1\n", 2, "ContextTokens"),
        (AZURE_HEADER + "2023-11-16 18:17:03,10,-1\n", 2, "GeneratedTokens"),
    ],
)
def test_azure_errors(write_lines: Writer, text: str, line: int, field: str) -> None:
    path = write_lines("az.csv", text)
    with pytest.raises(TraceFormatError) as info:
        read_trace(path, format="azure")
    assert (info.value.line, info.value.field) == (line, field)


def test_azure_skip_bad(write_lines: Writer) -> None:
    path = write_lines("az.csv", AZURE_HEADER + "2023-11-16 18:17:03,10,1\nx,1,1\n"
                       "2023-11-16 18:17:04,10,-1\n")
    tr = read_trace(path, skip_bad=True)
    assert tr.num_requests == 1 and tr.num_skipped_lines == 2


# ---------------------------------------------------------------- native
def _native_header(**fields: Any) -> dict[str, Any]:
    header = {"flatcake_trace": 1, "block_size_tokens": 4}
    header.update(fields)
    return header


def test_native_session_clock_groups_sessions_and_namespaces_ids(write_lines: Writer) -> None:
    path = write_lines("n.jsonl", [
        _native_header(clock="session", hash_scope="session", partial_last_block=True),
        {"session": "b", "t": 5, "in": 5, "out": 1, "hash_ids": [1, 2]},
        {"session": "a", "t": 0, "in": 4, "out": 1, "hash_ids": [1]},
        {"session": "b", "t": 1, "in": 4, "out": 1, "think_time": 0.5, "hash_ids": [1]},
        {"session": 7, "agent": 1, "t": 0, "in": 0, "out": 0, "hash_ids": []},
    ])
    assert detect_format(path) == "native"
    tr = read_trace(path)
    assert tr.session_names == ("b", "a", "7")
    assert tr.session.tolist() == [0, 0, 1, 2]
    assert tr.time_s.tolist() == [1.0, 5.0, 0.0, 0.0]
    assert tr.think_time_s[0] == 0.5
    assert [tr.blocks(i).tolist() for i in range(4)] == [[1], [1, 2], [NS | 1], []]
    assert tr.agent.tolist() == [0, 0, 0, 1]


@pytest.mark.parametrize(
    ("lines", "line", "field"),
    [
        ([{"block_size_tokens": 4}], 1, "header.flatcake_trace"),
        ([_native_header(flatcake_trace=2)], 1, "header.flatcake_trace"),
        ([_native_header(block_size_tokens=0)], 1, "header.block_size_tokens"),
        ([_native_header(clock="wall")], 1, "header.clock"),
        ([_native_header(hash_scope="x")], 1, "header.hash_scope"),
        ([_native_header(partial_last_block="yes")], 1, "header.partial_last_block"),
        ([b"{bad"], 1, "<header>"),
        ([_native_header(), {"in": 4, "out": 1}], 2, "t"),
        ([_native_header(), {"t": 0, "in": -4, "out": 1}], 2, "in"),
        ([_native_header(), {"t": 0, "in": 8, "out": 1, "hash_ids": [1]}], 2, "hash_ids"),
        ([_native_header(partial_last_block=True), {"t": 0, "in": 5, "out": 1,
                                                    "hash_ids": [1]}], 2, "hash_ids"),
        ([_native_header(), {"t": 0, "in": 4, "out": 1, "hash_ids": [1]},
          {"t": 0, "in": 4, "out": 1}], 3, "hash_ids"),
        ([_native_header(clock="session"), {"t": 0, "in": 4, "out": 1}], 2, "session"),
        ([_native_header(), {"t": 0, "in": 4, "out": 1, "session": [1]}], 2, "session"),
        ([_native_header(), {"t": 0, "in": 4, "out": 1, "agent": -1}], 2, "agent"),
    ],
)
def test_native_errors(write_lines: Writer, lines: list[Any], line: int, field: str) -> None:
    path = write_lines("n.jsonl", lines)
    with pytest.raises(TraceFormatError) as info:
        read_trace(path, format="native")
    assert (info.value.line, info.value.field) == (line, field)


def _assert_same(a: Any, b: Any) -> None:
    for col in ("time_s", "session", "agent", "turn", "input_tokens", "output_tokens",
                "block_offsets", "block_hashes"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col
    assert np.array_equal(a.think_time_s, b.think_time_s, equal_nan=True)
    assert (a.clock, a.block_size_tokens, a.has_hashes, a.partial_last_block) == \
        (b.clock, b.block_size_tokens, b.has_hashes, b.partial_last_block)
    assert a.session_names == b.session_names


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_native_round_trip(tmp_path: Path, write_lines: Writer, suffix: str) -> None:
    sources = [
        read_trace(write_lines("cc.jsonl", [_cc_session(), _cc_small("s2")])),
        read_trace(write_lines("mc.jsonl", [_mc(0, 600, [0, 1]), _mc(5, 10, [0])])),
        generate_workload(WorkloadSpec(kind="mixed", num_sessions=6, seed=3)),
    ]
    for k, src in enumerate(sources):
        out = write_native(src, tmp_path / f"rt{k}{suffix}")
        _assert_same(src, read_trace(out))


# ---------------------------------------------------------------- detection
def test_detection_errors_and_override(write_lines: Writer, tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="empty"):
        detect_format(write_lines("e.jsonl", ""))
    with pytest.raises(TraceFormatError, match="cannot detect"):
        detect_format(write_lines("u.jsonl", [{"foo": 1}]))
    with pytest.raises(FileNotFoundError):
        read_trace(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="unknown trace format"):
        read_trace(write_lines("m.jsonl", [_mc(0, 10, [1])]), format="parquet")
    # A Mooncake line read as native fails on the missing header field, not silently.
    with pytest.raises(TraceFormatError, match="flatcake_trace"):
        read_trace(write_lines("m2.jsonl", [_mc(0, 10, [1])]), format="native")
