"""``flatcake demo --nodes 2``: Redis and two ``flatcake node`` processes on this machine;
node 1 restores node 0's blocks over remote memory and remote SSD, byte-exact."""

from __future__ import annotations

import pytest

from flatcake.cli import main
from flatcake.cluster import redis_available


def test_demo_with_two_nodes_restores_byte_exact(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path, capsys) -> None:
    from tests.cluster.helpers import nixl_python

    if redis_available():
        pytest.skip(redis_available() or "")
    python = nixl_python()
    if python is None:
        pytest.skip("no NIXL venv (scripts/nixl_venv.sh or FLATCAKE_NIXL_PYTHON)")
    monkeypatch.setenv("FLATCAKE_NIXL_PYTHON", python)
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--nodes", "2", "--cluster-blocks", "16", "--timeout-s", "150"]) == 0
    out = capsys.readouterr().out
    assert "remote memory (NIXL READ)" in out
    assert out.count("byte-exact, CRC ok") == 2
    assert "OK: every block byte-exact" in out
    assert list(tmp_path.iterdir()) == []  # the nodes' files went with the demo
