"""The recurrent state checkpoints vLLM hands a connector (``mamba_cache_mode="align"``,
vLLM 0.32), as the slots of a segment's state rows.

A state group's block list is not append-only: vLLM nulls and frees a request's interior
states as it goes, so a state is never read positionally out of it. Instead each step's
``SchedulerOutput.kv_connector_block_state.boundary_state_offloads`` names, per request,
``(group, block_id, boundary_tokens)``: the block holding the state as of
``boundary_tokens`` (``KVCacheManager.take_boundary_state_offloads``,
``vllm/v1/core/kv_cache_manager.py``; recorded in ``MambaManager.cache_blocks``,
``vllm/v1/core/single_type_kv_cache_manager.py``), valid until the end of the pass that
offered it. ``StateCheckpoints`` keeps them per request and gives a segment's slots of
each state group: FlatCake block ``i`` holds the checkpoint at its end, ``(i + 1) *
block_tokens``, and the null block where none was offered or the request no longer
holds the block (vLLM freed it: the store, which reads the blocks when the step's
forward pass ends, could read another request's state), so ``GroupedKV.snapshot``
stores no segment whose end state is missing. The state at the end of a prompt is read
from the block its last step's forward pass starts from, which the request holds. A
checkpoint inside a FlatCake block (a shared-prefix junction, a partial tail) is kept
but has no block slot.

A restore needs no book: vLLM reads an external hit's state from the state group's block
at the hit's last block (``MambaManager.allocate_new_blocks``: "the last block saves the
hit state"), a fresh block it allocates for the load, so a load's slots are positional
(``group_slots.slots_of``) and ``GroupedKV.scatter`` writes the last one only.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Offloads = Mapping[str, Sequence[tuple[int, int, int]]]
"""vLLM's ``boundary_state_offloads``: per request, ``(group, block_id, boundary_tokens)``."""


@dataclass
class StateCheckpoints:
    """Checkpoints offered for each request, by state group (``groups``: vLLM group ids)
    and boundary; ``block_tokens``: FlatCake's block; ``null_id``: the engine's null
    block."""

    groups: tuple[int, ...]
    block_tokens: int
    null_id: int = 0
    _held: dict[str, dict[int, dict[int, int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.groups or self.block_tokens <= 0:
            raise ValueError(f"state checkpoints of groups {self.groups} in "
                             f"{self.block_tokens}-token blocks")

    def offered(self, offloads: Offloads | None) -> None:
        """Take one step's offers (a later offer of a boundary replaces an earlier)."""
        for request_id, entries in (offloads or {}).items():
            for group, block_id, boundary in entries:
                if group not in self.groups:
                    raise ValueError(f"a state checkpoint of group {group} offered for "
                                     f"{request_id!r}; the state groups are {self.groups}")
                if boundary <= 0 or block_id == self.null_id:
                    raise ValueError(f"a state checkpoint of block {block_id} at token "
                                     f"{boundary} offered for {request_id!r}")
                self._held.setdefault(request_id, {}).setdefault(group, {})[boundary] = \
                    int(block_id)

    def boundaries(self, request_id: str) -> tuple[int, ...]:
        """The token boundaries whose state every state group has for the request."""
        by_group = self._held.get(request_id, {})
        common = set.intersection(*(set(by_group.get(g, {})) for g in self.groups))
        return tuple(sorted(common))

    def slots(self, request_id: str, lo: int, hi: int,
              holds: Mapping[int, Collection[int]] | None = None
              ) -> tuple[tuple[int, ...], ...]:
        """Per state group (``groups`` order), the slot of FlatCake blocks ``[lo, hi)``:
        the checkpoint at each block's end, else the null block; with ``holds`` (per
        group, the blocks the request holds in this step), a checkpoint whose block it
        no longer holds is the null block too: vLLM freed it, another request may
        write it before the store reads it."""
        by_group = self._held.get(request_id, {})
        out = []
        for g in self.groups:
            held = by_group.get(g, {})
            ids = [held.get((i + 1) * self.block_tokens, self.null_id) for i in range(lo, hi)]
            if holds is not None:
                ids = [b if b in holds.get(g, ()) else self.null_id for b in ids]
            out.append(tuple(ids))
        return tuple(out)

    def forget(self, request_ids: Iterable[str]) -> None:
        """Drop finished or preempted requests' checkpoints."""
        for request_id in request_ids:
            self._held.pop(request_id, None)


def state_checkpoints(kv_cache_config: Any, kv_groups: Any) -> StateCheckpoints | None:
    """The book of an engine whose stored groups hold recurrent states (``KVGroups``
    with a ``LayerGroup.state``), else None."""
    if kv_groups is None:
        return None
    specs = kv_cache_config.kv_cache_groups
    groups = tuple(g for g in kv_groups.stored
                   if getattr(specs[g].kv_cache_spec, "shapes", None))
    return StateCheckpoints(groups, kv_groups.tokens_per_block) if groups else None


def with_states(ids: Sequence[Sequence[int]], stored: Sequence[int],
                states: Mapping[int, Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """A segment's slots per stored group (``stored``: vLLM group ids), each state
    group's replaced by its checkpoints' (``states``: vLLM group id -> slots)."""
    return tuple(tuple(states[g]) if g in states else tuple(group)
                 for g, group in zip(stored, ids, strict=True))
