"""The run's last words on the cluster tests: one line when they skipped for want of
redis-server, with the install command; nothing when they ran."""

from __future__ import annotations

import pytest

from tests.conftest import redis_skip_line

WHY = "redis-server is not installed (apt-get install redis-server)"


def skipped(reason: str) -> pytest.TestReport:
    return pytest.TestReport("tests/cluster/test_x.py::t", ("x", 1, "t"), {}, "skipped",
                             ("tests/cluster/conftest.py", 25, f"Skipped: {reason}"), "setup")


def test_the_skipped_cluster_tests_are_counted_once() -> None:
    reports = [skipped(WHY)] * 46 + [skipped("no NIXL venv")]
    assert redis_skip_line(reports, WHY) == f"46 cluster tests skipped: {WHY}"


def test_nothing_is_said_when_redis_is_there_or_nothing_skipped_for_it() -> None:
    assert redis_skip_line([skipped(WHY)], WHY) == f"1 cluster test skipped: {WHY}"
    assert redis_skip_line([skipped(WHY)], None) is None
    assert redis_skip_line([skipped("no NIXL venv")], WHY) is None
