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


def test_replay_config_sets_every_key_the_replay_honours(tmp_path: Path) -> None:
    from flatcake.replay.presets import get_preset
    from flatcake.tune import replay_config

    cfg = tmp_path / "fc.toml"
    cfg.write_text("[placement]\nshort_reply_threshold_tokens = 99\n"
                   "[scheduler]\nsingle_queue = true\n"
                   "[store]\nrelease_old_windows = false\nroot = '/nvme/fc'\n"
                   "window_rows = 'branches'\nwindow_row_stride_tokens = 1024\n"
                   "memory_capacity_bytes = 1024\n")
    paper = get_preset("paper")
    got, ignored = replay_config(paper, str(cfg))
    assert got.flatcake.placement.short_reply_threshold_tokens == 99
    assert got.flatcake.scheduler.single_queue is True
    assert got.flatcake.store.release_old_windows is False
    assert (got.flatcake.store.window_rows, got.flatcake.store.window_row_stride_tokens) == \
        ("branches", 1024)
    # Budgets and paths stay the preset's, and are named back.
    assert ignored == ["store.root", "store.memory_capacity_bytes"]
    assert got.flatcake.store.root == paper.flatcake.store.root
    # Keys the file leaves alone keep the preset's values (not the config's defaults).
    assert got.flatcake.scheduler.max_restores_in_flight == \
        paper.flatcake.scheduler.max_restores_in_flight
    cfg.write_text("[store]\nrelease_old_windowz = false\n")
    with pytest.raises(ValueError, match="release_old_windowz"):
        replay_config(paper, str(cfg))


def test_release_old_windows_off_in_the_replay_releases_nothing(tmp_path: Path) -> None:
    from flatcake.replay.simulate import replay_node
    from flatcake.replay.workload.trace import from_requests
    from flatcake.tune import replay_config
    from tests.replay.helpers import ids, tiny_preset
    from tests.replay.layer_scenarios import HYBRID

    # A's second turn is durable: the window rows of its first are released (at once,
    # here), unless release is off.
    reqs = [(0.0, ids(0, 5), 160, 2), (5.0, ids(0, 9), 288, 2), (9.0, ids(0, 12), 384, 2)]
    preset = tiny_preset(gpu_blocks=14, host_blocks=3, geometry=HYBRID)
    cfg = tmp_path / "on.toml"
    cfg.write_text("[store]\nrelease_windows_at_once = true\n")
    on, _ = replay_node(from_requests(reqs, 32), "flatcake", 0.5,
                        replay_config(preset, str(cfg))[0])
    cfg = tmp_path / "off.toml"
    cfg.write_text("[store]\nrelease_old_windows = false\nrelease_windows_at_once = true\n")
    off, _ = replay_node(from_requests(reqs, 32), "flatcake", 0.5,
                         replay_config(preset, str(cfg))[0])
    assert on.extra["ssd_window_bytes_released"] > 0
    assert off.extra["ssd_window_bytes_released"] == 0
