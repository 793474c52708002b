"""A real ``redis-server`` on 127.0.0.1 per test module (``own_redis``: one for a test
that pauses it); the tests skip without one.
``python`` (the NIXL venv's interpreter) and ``env`` (NIXL for this interpreter's children)
skip a test that needs them when they are missing."""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Iterator

import pytest

from flatcake.cluster import RedisServer, redis_available
from tests.cluster.helpers import nixl_python, store_env

_names = itertools.count()


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    why = redis_available()
    if why:
        pytest.skip(why)
    with RedisServer() as server:
        yield server.url


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A server for this test alone (it may pause it: resumed before it stops)."""
    why = redis_available()
    if why:
        pytest.skip(why)
    with RedisServer() as server:
        try:
            yield server
        finally:
            os.kill(server.pid, signal.SIGCONT)


@pytest.fixture
def cluster(redis_url: str) -> str:
    """A fresh cluster name per test, so tests sharing a server never see each other."""
    return f"t{next(_names)}"


@pytest.fixture
def python() -> str:
    """The NIXL venv's python (``tests.cluster.helpers.nixl_python``)."""
    found = nixl_python()
    if found is None:
        pytest.skip("no NIXL venv (scripts/nixl_venv.sh or FLATCAKE_NIXL_PYTHON)")
    return found


@pytest.fixture
def env() -> dict[str, str]:
    """What a child of this interpreter needs to import NIXL (``store_env``)."""
    found = store_env()
    if found is None:
        pytest.skip("no NIXL venv usable with this interpreter's torch")
    return found
