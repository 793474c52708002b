"""FlatCake's block events as vLLM KV cache events (``BlockStored`` / ``BlockRemoved``).

A KV-aware router that consumes vLLM's KV events (``--kv-events-config``) learns from
these which engine holds a session's history in FlatCake, under the engine's own block
hashes (the ones its GPU prefix-cache events carry), with medium ``CPU`` (host memory)
or ``STORAGE`` (SSD). ``BlockStored`` is sent once the blocks are durable and indexed;
``BlockRemoved`` when reclaim or a damaged segment drops them. When a newer turn
releases an older turn's window rows (``store.release_old_windows``), no hit ends in
that turn's blocks any more while longer hits still read them: a ``BlockRemoved`` per
KV cache group of the released layers (``group_idx``, as vLLM reports its own sliding
window's blocks), the other groups' blocks still advertised. Blocks recovered from
disk at start-up were hashed by an earlier process and have no engine hashes here:
their removal is not reported.

Scheduler thread only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from vllm.distributed.kv_events import (
    MEDIUM_CPU,
    MEDIUM_STORAGE,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)
from vllm.v1.core.kv_cache_utils import BlockHash, maybe_convert_block_hash

from flatcake.connectors.scheduler_side import BlockEvent
from flatcake.control.address import Medium

_MEDIUM = {Medium.MEMORY: MEDIUM_CPU, Medium.SSD: MEDIUM_STORAGE}


class EventBook:
    """FlatCake keys -> the engine block hashes (and tokens) they were stored under."""

    def __init__(self, block_size: int, layer_groups: Sequence[int] = ()) -> None:
        """``layer_groups``: the engine's KV cache group of each FlatCake layer (empty:
        one group, reported without ``group_idx``)."""
        self.block_size = block_size
        self._layer_groups = tuple(layer_groups)
        self._hashes: dict[bytes, bytes] = {}  # key -> engine hash, while indexed
        # first key of a planned store -> (parent hash, token ids of its blocks)
        self._planned: dict[bytes, tuple[bytes | None, list[int]]] = {}

    def planned(self, keys: Sequence[bytes], hashes: Sequence[bytes],
                parent: bytes | None, token_ids: Sequence[int]) -> None:
        """A store of ``keys`` (engine hashes ``hashes``, the block before them
        ``parent``) was planned; its ``token_ids`` are reported once it is durable."""
        if not keys:
            return
        self._hashes.update(zip(keys, hashes, strict=True))
        self._planned[keys[0]] = (parent, list(token_ids))

    def convert(self, events: Iterable[BlockEvent]) -> list[KVCacheEvent]:
        out: list[KVCacheEvent] = []
        for ev in events:
            hashes = [self._hashes[k] for k in ev.keys if k in self._hashes]
            if ev.stored:
                parent, tokens = self._planned.pop(ev.keys[0], (None, []))
                if len(hashes) != len(ev.keys) or len(tokens) != len(ev.keys) * self.block_size:
                    continue
                out.append(BlockStored(
                    block_hashes=[maybe_convert_block_hash(BlockHash(h)) for h in hashes],
                    parent_block_hash=(None if parent is None
                                       else maybe_convert_block_hash(BlockHash(parent))),
                    token_ids=tokens, block_size=self.block_size, lora_id=None,
                    medium=_MEDIUM[ev.medium], lora_name=None))
            elif hashes:
                if not ev.layers:  # the whole blocks: forgotten
                    for k in ev.keys:
                        self._hashes.pop(k, None)
                ext = [maybe_convert_block_hash(BlockHash(h)) for h in hashes]
                for group in self._groups(ev.layers):
                    out.append(BlockRemoved(block_hashes=ext, medium=_MEDIUM[ev.medium],
                                            group_idx=group))
        return out

    def _groups(self, layers: Sequence[int]) -> Sequence[int | None]:
        """The KV cache groups whose blocks ``layers`` dropped (``[None]``: every group)."""
        if not layers or not self._layer_groups:
            return [None]
        return sorted({self._layer_groups[layer] for layer in layers})
