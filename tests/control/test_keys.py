"""Block keys: chained, namespaced, cryptographic; engine hashes accepted as they are."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flatcake.control.keys import as_block_key, chain_block_keys, check_key, namespace_key

TOKENS = list(range(100, 164))  # 64 tokens = 4 blocks of 16


def test_one_key_per_full_block_32_bytes() -> None:
    keys = chain_block_keys([*TOKENS, 1, 2, 3], 16, "llama")
    assert len(keys) == 4  # the partial block of 3 tokens gets no key
    assert all(isinstance(k, bytes) and len(k) == 32 for k in keys)
    assert len(set(keys)) == 4


def test_deterministic() -> None:
    assert chain_block_keys(TOKENS, 16, "llama", b"t") == chain_block_keys(TOKENS, 16, "llama",
                                                                             b"t")


def test_key_zero_depends_on_model_and_salt() -> None:
    base = chain_block_keys(TOKENS, 16, "llama", b"tenant-a")
    other_model = chain_block_keys(TOKENS, 16, "mistral", b"tenant-a")
    other_salt = chain_block_keys(TOKENS, 16, "llama", b"tenant-b")
    for i in range(4):
        assert base[i] != other_model[i]
        assert base[i] != other_salt[i]
    # str and bytes salts with the same utf-8 bytes are the same namespace.
    assert chain_block_keys(TOKENS, 16, "llama", "tenant-a") == base


def test_chaining_a_change_propagates_forward_only() -> None:
    base = chain_block_keys(TOKENS, 16, "m")
    changed = list(TOKENS)
    changed[2 * 16 + 5] += 1  # inside block 2
    keys = chain_block_keys(changed, 16, "m")
    assert keys[:2] == base[:2]
    assert keys[2] != base[2] and keys[3] != base[3]


def test_same_block_tokens_at_different_positions_differ() -> None:
    block = list(range(16))
    keys = chain_block_keys(block * 3, 16, "m")
    assert len(set(keys)) == 3  # the key names the prefix, not the block


def test_parent_continues_the_chain() -> None:
    whole = chain_block_keys(TOKENS, 16, "m", b"s")
    head = chain_block_keys(TOKENS[:32], 16, "m", b"s")
    tail = chain_block_keys(TOKENS[32:], 16, "m", b"s", parent=head[-1])
    assert head + tail == whole


def test_boundary_is_a_keyed_digest_not_plain_concat() -> None:
    # key0 is not the unkeyed digest of (zero parent + tokens): the namespace is mixed in.
    keys = chain_block_keys([1] * 4, 4, "m")
    plain = hashlib.blake2b(bytes(32) + (1).to_bytes(8, "little") * 4, digest_size=32).digest()
    assert keys[0] != plain
    assert namespace_key("m") != namespace_key("m", b"x")


@given(st.lists(st.integers(0, 2**63 - 1), min_size=0, max_size=80), st.integers(1, 17))
def test_prefix_property(tokens: list[int], block: int) -> None:
    keys = chain_block_keys(tokens, block, "m")
    assert len(keys) == len(tokens) // block
    for n in range(len(keys) + 1):
        assert chain_block_keys(tokens[: n * block], block, "m") == keys[:n]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"tokens_per_block": 0}, "tokens_per_block"),
        ({"tokens_per_block": 2.5}, "tokens_per_block"),
        ({"model": ""}, "model"),
        ({"tenant_salt": 7}, "tenant_salt"),
        ({"parent": b"short"}, "parent"),
        ({"token_ids": [1, -1, 2, 3]}, "token_ids"),
        ({"token_ids": [1, 2.5, 2, 3]}, "token_ids"),
        ({"token_ids": [1, 2**63, 2, 3]}, "token_ids"),
    ],
)
def test_bad_input_names_the_field(kwargs: dict[str, object], needle: str) -> None:
    args: dict[str, object] = {"token_ids": [1, 2, 3, 4], "tokens_per_block": 2, "model": "m"}
    args.update(kwargs)
    with pytest.raises(ValueError, match=needle):
        chain_block_keys(**args)  # type: ignore[arg-type]


class TestAsBlockKey:
    def test_32_bytes_pass_unchanged(self) -> None:
        h = hashlib.sha256(b"x").digest()
        assert as_block_key(h) is h

    def test_int_is_big_endian(self) -> None:
        assert as_block_key(5) == bytes(31) + b"\x05"
        assert as_block_key(int.from_bytes(b"\xab" * 32, "big")) == b"\xab" * 32

    def test_hex_string_spells_its_bytes(self) -> None:
        h = hashlib.sha256(b"y").digest()
        assert as_block_key(h.hex()) == h
        assert as_block_key(h.hex().upper()) == h

    def test_others_are_hashed_distinctly(self) -> None:
        short = as_block_key(b"\x01")
        assert len(short) == 32
        assert short != b"\x01" + bytes(31) and short != bytes(31) + b"\x01"
        assert as_block_key(-1) != as_block_key(2**256 - 1)
        assert as_block_key("abc") != as_block_key(b"abc")
        assert as_block_key(2**256) != as_block_key(0)
        assert as_block_key("abc") == as_block_key("abc")

    @given(st.one_of(st.binary(), st.integers(), st.text()))
    def test_always_32_bytes_and_deterministic(self, v: bytes | int | str) -> None:
        k = as_block_key(v)
        assert len(k) == 32 and as_block_key(v) == k

    @pytest.mark.parametrize("bad", [1.5, None, True, [1]])
    def test_bad_type(self, bad: object) -> None:
        with pytest.raises(ValueError, match="engine_hash"):
            as_block_key(bad)  # type: ignore[arg-type]


def test_check_key_names_field() -> None:
    with pytest.raises(ValueError, match=r"keys\[3\]"):
        check_key(b"x", "keys[3]")


def test_request_salt_is_a_second_tenant_field() -> None:
    from flatcake.control.keys import engine_block_key

    plain = namespace_key("llama", "deploy")
    # Absent or empty request salt: the namespace of the deployment alone.
    assert namespace_key("llama", "deploy", None) == plain == namespace_key("llama", "deploy", "")
    a, b = namespace_key("llama", "deploy", "alice"), namespace_key("llama", "deploy", "bob")
    assert len({plain, a, b}) == 3
    # The fields are length-prefixed: moving bytes between the salts changes the namespace.
    assert namespace_key("llama", "deployal", "ice") != namespace_key("llama", "deploy", "alice")
    h = bytes(range(32))
    assert engine_block_key(a, h) != engine_block_key(b, h) != engine_block_key(plain, h)
    assert engine_block_key(a, h) == engine_block_key(a, bytearray(h))
    for bad_ns, bad_hash in ((b"short", h), (a, b""), (a, "hex")):
        with pytest.raises(ValueError):
            engine_block_key(bad_ns, bad_hash)  # type: ignore[arg-type]


def test_engine_keys_remember_what_they_hashed() -> None:
    from flatcake.control.keys import EngineKeys, engine_block_key

    ns = namespace_key("llama", "deploy")
    hashes = [bytes([i]) * 32 for i in range(64)]
    keys = EngineKeys(ns, capacity=100)
    first = keys.keys(hashes)
    assert first == tuple(engine_block_key(ns, h) for h in hashes)  # the same keys
    assert keys.num_hashed == 64
    # The same prefix again (a request the engine's prefix cache serves): no digest.
    assert keys.keys(hashes) == first and keys.num_hashed == 64
    # A longer prompt over it: only its new blocks are hashed.
    more = hashes + [bytes([200 + i]) * 32 for i in range(8)]
    assert keys.keys(more)[64:] == tuple(engine_block_key(ns, h) for h in more[64:])
    assert keys.num_hashed == 72
    assert keys.keys([bytearray(hashes[0])]) == first[:1] and keys.num_hashed == 72


def test_engine_keys_forget_the_oldest_past_capacity() -> None:
    from flatcake.control.keys import EngineKeys

    keys = EngineKeys(namespace_key("llama"), capacity=10)
    hashes = [bytes([i]) * 32 for i in range(25)]
    keys.keys(hashes)
    assert 10 <= len(keys) <= 20 and keys.num_hashed == 25
    keys.keys(hashes[-10:])  # the newest are still remembered
    assert keys.num_hashed == 25
    keys.keys(hashes[:1])  # the oldest went: hashed again
    assert keys.num_hashed == 26


def test_engine_keys_keep_what_is_asked_for_again() -> None:
    from flatcake.control.keys import EngineKeys, engine_block_key

    ns = namespace_key("llama")
    keys = EngineKeys(ns, capacity=10)
    held = [bytes([200 + i]) * 32 for i in range(4)]  # a prompt the engine keeps serving
    keys.keys(held)
    for n in range(12):  # new prompts in between; the held one asked for after each
        keys.keys([bytes([n]) * 32, bytes([100 + n]) * 32])
        assert keys.keys(held) == tuple(engine_block_key(ns, h) for h in held)
    assert keys.num_hashed == 4 + 24  # the held prompt was never hashed again
    assert len(keys) <= 20


@pytest.mark.parametrize("bad", [b"", "hex", 7])
def test_engine_keys_refuse_what_is_not_a_hash(bad: object) -> None:
    from flatcake.control.keys import EngineKeys

    with pytest.raises(ValueError, match="engine_hash must be non-empty bytes"):
        EngineKeys(namespace_key("llama")).keys([bytes(32), bad])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="namespace must be 32 bytes"):
        EngineKeys(b"short")
