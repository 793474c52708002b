"""The replay's side of the calibration: a file's fixed costs reach the ``local`` preset
(and only it), bad files are refused, and ``--explain`` says where costs come from."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from flatcake.cli import main
from flatcake.replay.calibration import CALIBRATION_ENV, FORMAT, load_calibration
from flatcake.replay.presets import get_preset, with_calibration


def _file(tmp_path: Path, **values: object) -> Path:
    p = tmp_path / "cal.json"
    p.write_text(json.dumps({"format": FORMAT, "restore_overhead_s": 0.004,
                             "command_s": 50e-6, "directory": "/disk", **values}))
    return p


def test_a_file_sets_the_fixed_cost_and_flatcakes_cost_per_command(tmp_path: Path) -> None:
    local = get_preset("local")
    got = with_calibration(local, _file(tmp_path))
    assert got.node.restore_overhead_s == 0.004
    assert got.node.store_command_s == 50e-6
    assert got.node.ssd == local.node.ssd  # the baselines keep the drive's figures
    assert "/disk" in got.cost_source


def test_flatcake_restores_pay_the_measured_cost_per_command() -> None:
    """Same workload, same drive: only FlatCake's restore time moves with the
    measured per-command cost; the baseline's does not."""
    from flatcake.replay.simulate import run_replay
    from flatcake.replay.workload.trace import from_requests
    from tests.replay.helpers import BLOCK_BYTES, GEOMETRY, ids, tiny_preset

    bt = GEOMETRY.tokens_per_block
    first = ids(0, 40)
    reqs = [(0.0, first, 40 * bt, 4), (100.0, [*first, *ids(40, 50)], 50 * bt, 4)]
    wl = from_requests(reqs, bt, name="two-turns")
    # Round robin over two workers: the second turn runs where the first is not on the
    # GPU, and one block of host memory sends the first turn to SSD in every system.
    base = tiny_preset(workers=2, gpu_blocks=100, host_blocks=1,
                       ssd_read_bytes_per_s=BLOCK_BYTES * 1e3)
    slow = dataclasses.replace(base, node=dataclasses.replace(base.node, store_command_s=0.5))
    for system, moves in (("flatcake", True), ("tiered-direct", False)):
        a = run_replay(wl, system, 1.0, base).prefetch_time_mean_s
        b = run_replay(wl, system, 1.0, slow).prefetch_time_mean_s
        assert (b > a + 0.4) if moves else (b == a), system


def test_the_environment_reaches_local_only(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    before = get_preset("local")
    monkeypatch.setenv(CALIBRATION_ENV, str(_file(tmp_path)))
    assert get_preset("local").node.restore_overhead_s == 0.004
    assert before.node.restore_overhead_s != 0.004
    paper = get_preset("paper")
    assert paper.node.restore_overhead_s == 0.001  # the paper's documented guess
    assert "guess" in paper.cost_source


@pytest.mark.parametrize("values, match", [
    ({"format": "other"}, "not a calibration file"),
    ({"command_s": -1.0}, "command_s"),
    ({"restore_overhead_s": "fast"}, "restore_overhead_s"),
])
def test_bad_files_are_refused(tmp_path: Path, values: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_calibration(_file(tmp_path, **values))
    with pytest.raises(ValueError, match="cannot read"):
        load_calibration(tmp_path / "missing.json")


def test_explain_states_the_geometry_and_where_costs_come_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--explain"]) == 0
    text = capsys.readouterr().out
    assert "geometry deepseek-v4-flash: 167 layers, 128-token blocks" in text
    assert "c4a 21 x 18,720 B" in text and "c128a 20 x 864 B" in text
    assert "sliding 43 x 74,880 B (18.28 x 4,096 B), window 1 block" in text
    assert "c4a-state 21 x 65,664 B (16.03 x 4,096 B), window 1 block" in text
    assert "501,120 B per block in the layers that keep every block" in text
    assert "padding" in text
    assert "documented guesses" in text
    monkeypatch.setenv(CALIBRATION_ENV, str(_file(tmp_path)))
    assert main(["replay", "--preset", "local", "--explain"]) == 0
    text = capsys.readouterr().out
    assert "fixed cost per restore 4,000 us" in text and "measured by flatcake bench" in text
