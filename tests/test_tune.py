"""``flatcake tune``: the split keeps the two parts apart, the search stays in its budget,
and the snippet it prints is a config the store and ``flatcake replay --config`` read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from flatcake.cli import main
from flatcake.config import PlacementConfig, load_config
from flatcake.replay.workload.source import load_workload
from flatcake.replay.workload.trace import from_requests
from flatcake.tune import split, toml_snippet, tune


@pytest.fixture(scope="module")
def chat() -> object:
    return load_workload(None, kind="chat", sessions=80)[0]


def request_blocks(wl: object) -> list[tuple[int, ...]]:
    return sorted(tuple(wl.blocks(i).tolist()) for i in range(wl.num_requests))  # type: ignore[attr-defined]


def test_session_split_is_a_partition(chat: object) -> None:
    part, held = split(chat, 0.25, seed=3)  # type: ignore[arg-type]
    assert part.num_sessions + held.num_sessions == chat.num_sessions  # type: ignore[attr-defined]
    assert held.num_sessions == 20
    assert part.num_requests + held.num_requests == chat.num_requests  # type: ignore[attr-defined]
    # Every request lands in exactly one part, with its blocks and its place in its chain.
    assert sorted(request_blocks(part) + request_blocks(held)) == request_blocks(chat)
    for w in (part, held):
        for c in range(w.num_chains):
            reqs = w.requests_of_chain(c)
            assert list(w.turn[reqs]) == list(range(len(reqs)))
            assert len(set(w.session[reqs].tolist())) == 1


def test_global_clock_split_is_by_time() -> None:
    reqs = [(float(t), list(range(t, t + 3)), 10, 5) for t in range(10)]
    wl = from_requests(reqs, block_tokens=4)
    part, held = split(wl, 0.3)
    assert part.num_requests + held.num_requests == 10
    assert held.num_requests == 3 and part.num_requests == 7
    assert request_blocks(held) == [tuple(range(t, t + 3)) for t in (7, 8, 9)]
    with pytest.raises(ValueError, match="holdout"):
        split(wl, 1.0)


def test_search_within_budget_and_snippet_round_trips(chat: object, tmp_path: Path) -> None:
    res = tune(chat, "paper", [0.5], budget_cpu_s=20.0, jobs=1)  # type: ignore[arg-type]
    assert res.default == PlacementConfig()
    assert res.tried[0] == (res.default, res.tune_default)
    best_seen = max((s for _, s in res.tried), key=lambda s: (round(s.hit_rate, 4),
                                                              -s.ttft_mean_s))
    assert not best_seen.better_than(res.tune_best)  # the best tried is the one kept
    assert len({p for p, _ in res.tried}) == len(res.tried)  # nothing replayed twice
    # Stops before a batch it cannot afford (plus the held-back check).
    assert res.cpu_s <= 20.0 + res.holdout_best.cpu_s + res.holdout_default.cpu_s
    cfg = tmp_path / "tuned.toml"
    cfg.write_text(toml_snippet(res.best) + "\n")
    assert load_config(cfg, env={}).placement == res.best


def test_cli_prints_the_snippet_and_replay_takes_it(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    args = ["tune", "--workload", "chat", "--sessions", "60", "--rates", "0.5",
            "--budget-cpu-s", "5", "--jobs", "1"]
    assert main(args) == 0
    out = capsys.readouterr().out
    snippet = out[out.index("[placement]"):]
    cfg = tmp_path / "tuned.toml"
    cfg.write_text(snippet)
    placement = load_config(cfg, env={}).placement
    assert main(["replay", "--workload", "chat", "--sessions", "60", "--rate", "0.5",
                 "--config", str(cfg), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["system"] == "flatcake" and d["hit_rate_gpu"] > 0
    assert main([*args, "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert j["best"] == {f: getattr(placement, f) for f in j["best"]}
    assert np.isfinite(j["held_back"]["best"]["ttft_mean_s"])


def test_snippet_round_trips_every_field_kind(tmp_path: Path) -> None:
    for p in (PlacementConfig(), PlacementConfig(copy_on_restore=True)):
        cfg = tmp_path / "snippet.toml"
        cfg.write_text(toml_snippet(p) + "\n")
        assert load_config(cfg, env={}).placement == p
