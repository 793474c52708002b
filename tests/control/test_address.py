"""64-bit address packing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flatcake.control.address import MAX_NODE, MAX_OFFSET, Address, Medium, encode_address


@given(st.sampled_from(list(Medium)), st.integers(0, MAX_NODE), st.integers(0, MAX_OFFSET))
def test_round_trip(medium: Medium, node: int, offset: int) -> None:
    value = encode_address(medium, node, offset)
    assert 0 <= value < 1 << 64
    assert Address.decode(value) == Address(medium, node, offset)
    assert value >> 60 == medium


def test_bit_positions() -> None:
    assert encode_address(Medium.SSD, 0xABC, 0x123) == 0x1ABC_0000_0000_0123


@pytest.mark.parametrize(
    ("medium", "node", "offset", "needle"),
    [(2, 0, 0, "medium"), (0, MAX_NODE + 1, 0, "node"), (0, 0, MAX_OFFSET + 1, "offset"),
     (0, -1, 0, "node")],
)
def test_range_checks(medium: int, node: int, offset: int, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        encode_address(medium, node, offset)


def test_reserved_medium_rejected_on_decode() -> None:
    with pytest.raises(ValueError, match="reserved medium"):
        Address.decode(0x2000_0000_0000_0000)
