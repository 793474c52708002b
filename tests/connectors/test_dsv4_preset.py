"""The ``deepseek-v4-flash`` geometry preset against the KV cache specs vLLM 0.32 builds
for DeepSeek-V4-Flash (``dsv4_kv``): each layer kind's bytes per N tokens, its window,
its layer count, and which kinds vLLM leaves out of its prefix cache (the replay's
``uncached_kinds`` for the paper preset) with bounded window replay on and off."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from typing import Any

import pytest

from flatcake.geometry import preset
from flatcake.replay.presets import PAPER_NODE
from tests.connectors.dsv4_kv import COMPRESS_RATIOS, dsv4_flash


def kind_of(name: str) -> str:
    """The preset's kind for one of vLLM's cache layers, by the module it belongs to."""
    ratio = COMPRESS_RATIOS[int(name.split(".")[2])]
    tag = f"c{ratio}a"
    if name.endswith(".swa_cache"):
        return "sliding"
    if name.endswith(".indexer.k_cache"):
        return f"{tag}-indexer"
    if name.endswith(".indexer.compressor.state_cache"):
        return f"{tag}-indexer-state"
    if name.endswith(".compressor.state_cache"):
        return f"{tag}-state"
    assert name.endswith(".self_attn"), name
    return tag


def vllm_kinds(bounded_replay: bool) -> dict[str, list[tuple[Any, str]]]:
    """Each kind's specs, as vLLM groups them (name, spec)."""
    _, config = dsv4_flash(bounded_replay)
    kinds: dict[str, list[tuple[Any, str]]] = {}
    for group in config.kv_cache_groups:
        spec = group.kv_cache_spec
        per_layer = getattr(spec, "kv_cache_specs", None) or {
            name: spec for name in group.layer_names}
        for name in group.layer_names:
            kinds.setdefault(kind_of(name), []).append((per_layer[name], name))
    return kinds


@pytest.mark.parametrize("bounded_replay", [True, False])
def test_preset_is_what_vllm_caches(bounded_replay: bool) -> None:
    geometry = preset("deepseek-v4-flash")
    groups = {grp.kind: grp for grp in geometry.layer_groups}
    kinds = vllm_kinds(bounded_replay)
    assert sorted(kinds) == sorted(groups)
    assert Counter({k: len(v) for k, v in kinds.items()}) == Counter(
        {k: g.num_layers for k, g in groups.items()})
    for kind, specs in kinds.items():
        grp = groups[kind]
        for spec, name in specs:
            per_token = Fraction(spec.page_size_bytes, spec.block_size)
            window = getattr(spec, "sliding_window", None) or 0
            assert window == grp.window_tokens, name
            if window:
                # A window's block: the window's tokens as of the block's end.
                assert grp.block_bytes(geometry.tokens_per_block) == window * per_token, name
            else:
                # vLLM's page covers block_size tokens, the preset's entry
                # tokens_per_entry tokens (its compress ratio, tokens_per_state).
                assert per_token == Fraction(grp.entry_bytes, grp.tokens_per_entry), name
                assert spec.tokens_per_state == grp.tokens_per_entry, name
    uncached = sorted({kind for kind, specs in kinds.items()
                       for spec, _ in specs if not spec.prefix_cacheable})
    assert uncached == (sorted(PAPER_NODE.uncached_kinds) if bounded_replay else [])
