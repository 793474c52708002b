"""The O_DIRECT disk measurement behind the ``local`` replay preset: it gives a drive's
figures in the replay's own ``SsdSpec`` and leaves nothing on the disk."""

from __future__ import annotations

from pathlib import Path

from flatcake.bench.disk import MIB, measure_ssd


def test_measures_a_drive_and_leaves_no_scratch_file(direct_dir: Path) -> None:
    spec = measure_ssd(direct_dir, file_bytes=16 * MIB, threads=2, seconds=0.2)
    assert spec.read_bytes_per_s > 0 and spec.write_bytes_per_s > 0
    assert spec.command_latency_s > 0 and spec.queue_depth >= 1
    assert spec.capacity_bytes == 0  # the budget is the caller's
    assert list(direct_dir.iterdir()) == []


def test_command_needs_a_directory_and_names_a_bad_one(tmp_path: Path, capsys) -> None:
    import pytest

    from flatcake.bench.disk import main

    with pytest.raises(SystemExit) as e:
        main(["disk"])  # no directory: nothing is written under the working directory
    assert e.value.code == 2
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SystemExit) as e:
        main(["disk", str(blocker / "sub"), "--mib", "16"])
    assert e.value.code == 2
    assert "cannot measure under" in capsys.readouterr().err
