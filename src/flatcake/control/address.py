"""64-bit global virtual addresses (FC-GVA).

    63      60 59            48 47                                         0
    +---------+----------------+--------------------------------------------+
    | medium  |    node id     |   byte offset in the node's medium space   |
    +---------+----------------+--------------------------------------------+

Medium 0 is host memory, 1 is SSD; 2..15 are reserved. A block's address is fixed
when it is allocated and never changes, so the medium bits alone pick the transport.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

MEDIUM_BITS = 4
NODE_BITS = 12
OFFSET_BITS = 48
MAX_NODE = (1 << NODE_BITS) - 1
MAX_OFFSET = (1 << OFFSET_BITS) - 1
_NODE_SHIFT = OFFSET_BITS
_MEDIUM_SHIFT = OFFSET_BITS + NODE_BITS


class Medium(IntEnum):
    MEMORY = 0
    SSD = 1


def encode_address(medium: int, node: int, offset: int) -> int:
    """Pack (medium, node, offset) into a 64-bit int, checking every range."""
    if medium not in (Medium.MEMORY, Medium.SSD):
        raise ValueError(f"address medium must be 0 (memory) or 1 (ssd), got {medium!r}")
    if not 0 <= node <= MAX_NODE:
        raise ValueError(f"address node must be in [0, {MAX_NODE}], got {node!r}")
    if not 0 <= offset <= MAX_OFFSET:
        raise ValueError(f"address offset must be in [0, 2**48), got {offset!r}")
    return (int(medium) << _MEDIUM_SHIFT) | (node << _NODE_SHIFT) | offset


@dataclass(frozen=True, slots=True)
class Address:
    """A decoded global virtual address."""

    medium: Medium
    node: int
    offset: int

    def __post_init__(self) -> None:
        encode_address(self.medium, self.node, self.offset)  # range checks

    @property
    def value(self) -> int:
        return encode_address(self.medium, self.node, self.offset)

    @classmethod
    def decode(cls, value: int) -> Address:
        if not 0 <= value < (1 << 64):
            raise ValueError(f"address must be an unsigned 64-bit int, got {value!r}")
        medium = value >> _MEDIUM_SHIFT
        if medium not in (Medium.MEMORY, Medium.SSD):
            raise ValueError(f"address {value:#018x} has reserved medium {medium}")
        return cls(Medium(medium), (value >> _NODE_SHIFT) & MAX_NODE, value & MAX_OFFSET)

    def __add__(self, delta: int) -> Address:
        return Address(self.medium, self.node, self.offset + delta)

    def __str__(self) -> str:
        return f"{self.medium.name.lower()}:{self.node}:{self.offset:#x}"


def address_medium(value: int) -> Medium:
    """The medium of an encoded address, without a full decode (hot path)."""
    return Medium(value >> _MEDIUM_SHIFT)


def decode_address(value: int) -> Address:
    return Address.decode(value)
