"""A real ``redis-server`` on 127.0.0.1 per test module; the tests skip without one."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from flatcake.cluster import RedisServer, redis_available

_names = itertools.count()


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    why = redis_available()
    if why:
        pytest.skip(why)
    with RedisServer() as server:
        yield server.url


@pytest.fixture
def cluster(redis_url: str) -> str:
    """A fresh cluster name per test, so tests sharing a server never see each other."""
    return f"t{next(_names)}"
