"""The keys of an engine's requests (``connectors.requests.RequestKeys``): converted once
per block, and not at all for a prompt the engine has seen before."""

from __future__ import annotations

from dataclasses import dataclass, field

from flatcake.connectors.requests import RequestKeys
from flatcake.control.keys import engine_block_key, namespace_key


@dataclass
class Req:
    """What the keys read off vLLM's ``Request``."""

    request_id: str
    block_hashes: list[bytes] = field(default_factory=list)
    cache_salt: str | None = None


def hashes(n: int, seed: int = 0) -> list[bytes]:
    return [bytes([seed, i % 256, i // 256]) * 8 for i in range(n)]


def test_the_second_request_of_a_held_prompt_hashes_zero_blocks() -> None:
    keys = RequestKeys("llama", "deploy", 1)
    a = Req("a", hashes(64))
    first = keys.keys(a)
    ns = namespace_key("llama", "deploy")
    assert first == tuple(engine_block_key(ns, h) for h in a.block_hashes)
    assert keys.num_hashed == 64
    for _ in range(5):  # every step it waits: its keys as they were
        assert keys.keys(a) is first
    b = Req("b", hashes(64))  # another request of the same prompt
    assert keys.keys(b) == first and keys.num_hashed == 64
    keys.forget("a")
    keys.forget("b")
    assert keys.keys(Req("c", hashes(64))) == first and keys.num_hashed == 64


def test_a_growing_request_hashes_only_its_new_blocks() -> None:
    keys = RequestKeys("llama", "", 2)  # two engine hash blocks per FlatCake block
    r = Req("r", hashes(5))
    assert len(keys.keys(r)) == 2 and keys.num_hashed == 2
    r.block_hashes += hashes(8)[5:]
    ns = namespace_key("llama", "")
    assert keys.keys(r) == tuple(engine_block_key(ns, h) for h in r.block_hashes[1::2])
    assert keys.num_hashed == 4


def test_a_cache_salt_is_its_own_namespace() -> None:
    keys = RequestKeys("llama", "", 1)
    plain = keys.keys(Req("a", hashes(4)))
    salted = keys.keys(Req("b", hashes(4), cache_salt="alice"))
    assert set(plain).isdisjoint(salted) and keys.num_hashed == 8
    assert keys.keys(Req("c", hashes(4), cache_salt="alice")) == salted
    assert keys.num_hashed == 8
