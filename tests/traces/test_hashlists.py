"""Hash-list decoding: the fast numpy path and the exact path agree, bad lists are named."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flatcake.traces.hashlists import (
    HashListDecoder,
    check_global_ids,
    lift_hash_lists,
    namespace_ids,
    parse_int_list,
)
from flatcake.traces.model import SESSION_SHIFT


def test_lift_replaces_lists_by_their_index() -> None:
    line = b'{"a": 1, "hash_ids": [1, 2], "r": [{"hash_ids" : [ ]}, {"hash_ids":[3]}]}'
    slim, spans = lift_hash_lists(line)
    assert spans == [b"1, 2", b" ", b"3"]
    assert slim == b'{"a": 1, "hash_ids":0, "r": [{"hash_ids":1}, {"hash_ids":2}]}'


@given(st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 2), max_size=40),
       st.sampled_from([",", ", ", " ,\n "]))
def test_parse_matches_json(values: list[int], sep: str) -> None:
    text = sep.join(str(v) for v in values).encode()
    assert parse_int_list(text).tolist() == values


@pytest.mark.parametrize("text", [b"1,", b"1,,2", b"-", b"1.5", b"1e3", b'"a"', b"1 2",
                                  b"[1]", b"true"])
def test_parse_rejects_non_int_lists(text: bytes) -> None:
    with pytest.raises(ValueError):
        parse_int_list(text)


def test_decoder_extends_previous_list_and_restarts_when_not_a_prefix() -> None:
    dec = HashListDecoder()
    a = dec.decode(b"1, 2, 3")
    b = dec.decode(b"1, 2, 3, 4, 5")
    c = dec.decode(b"1, 2, 34")  # a textual prefix but not a list prefix
    d = dec.decode(b"1, 2, 34")
    assert a.tolist() == [1, 2, 3]
    assert b.tolist() == [1, 2, 3, 4, 5]
    assert c.tolist() == [1, 2, 34]
    assert d is c
    with pytest.raises(ValueError):
        dec.decode(b"1, 2, 34, x")


def test_namespace_and_range_checks() -> None:
    ids = np.array([0, 5, 2**SESSION_SHIFT - 1], dtype=np.int64)
    out = namespace_ids(ids.copy(), 3)
    assert (out >> SESSION_SHIFT).tolist() == [3, 3, 3]
    assert (out & (2**SESSION_SHIFT - 1)).tolist() == ids.tolist()
    with pytest.raises(ValueError, match="per-session id -1"):
        namespace_ids(np.array([-1]), 1)
    with pytest.raises(ValueError, match="outside"):
        namespace_ids(np.array([2**SESSION_SHIFT]), 1)
    # numpy saturates huge values; every reader range-checks what it decoded.
    with pytest.raises(ValueError, match="int64"):
        check_global_ids(parse_int_list(b"1, 99999999999999999999"))
    with pytest.raises(ValueError, match="outside"):
        namespace_ids(parse_int_list(b"99999999999999999999"), 0)
