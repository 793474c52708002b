"""What a restore reads, as values (FC-CIO): the read plan a planner (``plan.reads``,
``plan.stream``, the replay's ``plan.bulk``) returns, the books (``control``) hand out in
a ``LoadPlan``, and the executor (``cio``) carries out. A leaf beside ``layout``: it
imports nothing of FlatCake.

Where the bytes go: the *destination stream* of layer ``l`` is the request's blocks in
request order, block ``b`` at bytes ``[b * B, (b + 1) * B)`` with ``B`` the layer's block
size (``ReadPlan.layer_block_bytes[l]``). A ``Piece`` copies ``length`` bytes from
``offset_in_op`` of its op to ``dest_offset`` of that stream, as the planner worked it
out (the executor computes no offset of its own); it may span several consecutive
blocks, and ``dest_offset`` is a multiple of ``B`` except where a ``max_read_bytes``
split fell inside a block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple


class Piece(NamedTuple):
    """Bytes ``[offset_in_op, offset_in_op + length)`` of an op are the request's layer
    stream bytes ``[dest_offset, dest_offset + length)``."""

    dest_offset: int
    offset_in_op: int
    length: int


@dataclass(frozen=True, slots=True)
class ReadOp:
    """One SSD read command: ``length`` bytes at ``file_offset`` of ``file_id``.

    Attributes:
        file_id: the session file (``cio.format.session_file_name``).
        file_offset: start, a multiple of 4096.
        length: bytes to read, a multiple of 4096.
        pieces: where the wanted bytes of the op go, in op order; bytes of the op
            not covered by a piece are gap or alignment bytes, to be ignored.
    """

    file_id: int
    file_offset: int
    length: int
    pieces: tuple[Piece, ...]


@dataclass(frozen=True, slots=True)
class CopyOp:
    """One copy out of the host arena: ``length`` bytes at ``arena_offset``.

    Attributes:
        arena_offset: start in the host arena.
        length: bytes to copy (all wanted; copies never read through gaps).
        pieces: where those bytes go (see ``Piece``).
    """

    arena_offset: int
    length: int
    pieces: tuple[Piece, ...]


@dataclass(frozen=True, slots=True)
class LayerPlan:
    """Everything to read for one layer: SSD reads sorted by ``(file_id,
    file_offset)`` and arena copies sorted by ``arena_offset``."""

    layer: int
    ssd_ops: tuple[ReadOp, ...]
    memory_ops: tuple[CopyOp, ...]


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """A restore's reads, layer by layer.

    Attributes:
        layers: one ``LayerPlan`` per layer, in layer order (empty when nothing hit).
        num_blocks: request blocks covered (the hit prefix length).
        layer_block_bytes: bytes of one block of each layer (empty when nothing hit).
        num_commands: SSD read commands over all layers.
        useful_bytes: SSD bytes the request wants.
        gap_bytes: SSD bytes read but not wanted (holes read through + alignment).
        bytes_read: SSD bytes read (``useful_bytes + gap_bytes``).
        num_copies: arena copy ops over all layers.
        memory_bytes: bytes copied out of the arena.
        layer_commands: SSD read commands of each layer, in layer order, where the
            planner counts them (the bulk planner, for layers of different sizes);
            empty otherwise.
    """

    layers: tuple[LayerPlan, ...]
    num_blocks: int
    layer_block_bytes: tuple[int, ...]
    num_commands: int
    useful_bytes: int
    gap_bytes: int
    bytes_read: int
    num_copies: int
    memory_bytes: int
    layer_commands: tuple[int, ...] = ()


ReadPlanner = Callable[..., ReadPlan]
"""What plans a restore's reads: called as ``planner(runs, num_layers, cfg)`` by the
books' ``prepare_load`` with the hit's runs, the layer count and ``config.planner`` (an
SSD run's file and offset are its segment's own ``file_id`` and ``file_offset``). The
plans give them: ``plan.reads.plan_reads``, ``plan.stream.StreamPlanner`` (one per
restore: it also records the checksums to verify), the replay's totals-only
``plan.bulk.plan_totals``."""
