"""Geometry presets and configuration loading."""

from __future__ import annotations

import pytest

from flatcake.config import FlatCakeConfig, load_config
from flatcake.geometry import KVGeometry, LayerGroup, preset


def test_presets_bytes_per_token() -> None:
    # Llama-3.1-8B: 32 layers x K,V x 8 heads x 128 dim x 2 bytes = 128 KiB per token.
    assert preset("llama-3.1-8b").bytes_per_token == 128 * 1024
    # Llama-3.1-70B: 80 layers -> 320 KiB per token.
    assert preset("Llama-3.1-70B").bytes_per_token == 320 * 1024
    # DeepSeek-V3 MLA: 61 layers x 576 latent x 2 bytes.
    assert preset("deepseek-v3").bytes_per_token == 61 * 576 * 2


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_layers": 0, "tokens_per_block": 16, "num_kv_heads": 8, "head_dim": 128},
         "num_layers"),
        ({"num_layers": 2, "tokens_per_block": 16, "num_kv_heads": 8, "head_dim": 128,
          "dtype": "float64"}, "dtype"),
        ({"num_layers": 2, "tokens_per_block": 16, "num_kv_heads": 0, "head_dim": 128},
         "num_kv_heads"),
    ],
)
def test_geometry_rejects_bad_fields(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        KVGeometry(**kwargs)  # type: ignore[arg-type]


def test_deepseek_v4_flash_keeps_each_cache_vllm_keeps() -> None:
    # Per 128-token block and layer: 43 windows (585 B a token), c4a's MLA entry and
    # indexer key (585 and 135 B per 4 tokens), c128a's entry (864 B per 128 tokens),
    # compressor state (8,208, 2,160 and 4,104 B a token in 8, 8 and 128-token windows:
    # a window group's block is its window as of the block's end).
    g = preset("deepseek-v4-flash")
    assert g.num_layers == 167 and [grp.kind for grp in g.groups] == [
        "sliding", "c4a", "c4a-indexer", "c128a", "c4a-state", "c4a-indexer-state",
        "c128a-state"]
    assert g.layer_block_bytes == ((128 * 585,) * 43 + (32 * 585,) * 21 + (32 * 135,) * 21
                                   + (864,) * 20 + (8 * 8208,) * 21 + (8 * 2160,) * 21
                                   + (128 * 4104,) * 20)
    assert [grp.window_blocks(128) for grp in g.groups] == [1, 0, 0, 0, 1, 1, 1]
    assert not g.is_uniform and preset("deepseek-v3").is_uniform
    with pytest.raises(ValueError, match="layer_block_bytes"):
        _ = g.block_bytes_per_layer
    assert KVGeometry.from_record(g.to_record()) == g
    assert KVGeometry.from_record(preset("llama-3.1-8b").to_record()) == preset("llama-3.1-8b")


@pytest.mark.parametrize(("groups", "needle"), [
    ((LayerGroup(2, 64),), "hold 2 layers, num_layers is 3"),
    ((LayerGroup(3, 64, tokens_per_entry=32),), "does not divide the block of 16"),
    (("full",), "LayerGroup values"),
])
def test_layer_groups_are_checked(groups: tuple[LayerGroup, ...], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        KVGeometry(num_layers=3, tokens_per_block=16, groups=groups)
    with pytest.raises(ValueError, match="entry_bytes"):
        LayerGroup(1, 0)
    with pytest.raises(ValueError, match="window_tokens"):
        LayerGroup(1, 8, window_tokens=-1)


def test_unknown_preset_named() -> None:
    with pytest.raises(ValueError, match="gpt-9"):
        preset("gpt-9")


def test_config_sources_merge_in_order(tmp_path) -> None:
    toml = tmp_path / "fc.toml"
    toml.write_text('model = "llama-3.1-70b"\n[store]\nnode_id = 3\nio_mode = "direct"\n')
    cfg = load_config(
        toml,
        env={"FLATCAKE_STORE__NODE_ID": "5", "FLATCAKE_SCHEDULER__SINGLE_QUEUE": "true"},
        overrides=["placement.short_reply_threshold_tokens=100"],
    )
    assert cfg.model == "llama-3.1-70b"
    assert cfg.store.node_id == 5  # env beats file
    assert cfg.store.io_mode == "direct"
    assert cfg.scheduler.single_queue is True
    assert cfg.placement.short_reply_threshold_tokens == 100
    assert load_config(env={}) == FlatCakeConfig()


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("store.node_id=5000", "store.node_id"),
        ("store.io_mode=fast", "store.io_mode"),
        ("reclaim.ssd_low=0.95", "reclaim.ssd_low"),
        ("nosuch.field=1", "nosuch"),
        ("store.nosuch=1", "store.nosuch"),
        ("store.node_id=abc", "store.node_id"),
        ("store.cluster_url=127.0.0.1:6379", "store.cluster_url"),
        ("store.cluster_name=a:b", "store.cluster_name"),
        ("store.remote_timeout_s=0", "store.remote_timeout_s"),
        ("store.remote_window_bytes=100", "store.remote_window_bytes"),
        ("store.remote_windows=0", "store.remote_windows"),
        ("store.remote_windows=65", "store.remote_windows"),
        ("store.remote_timeout_s=inf", "store.remote_timeout_s=inf: must be a finite"),
        ("store.node_timeout_s=inf", "store.node_timeout_s=inf: must be a finite"),
        ("store.node_lease_s=nan", "store.node_lease_s=nan: must be a finite"),
        ("reclaim.ssd_high=nan", "reclaim.ssd_high=nan: must be a finite"),
    ],
)
def test_config_errors_name_field(override: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        load_config(env={}, overrides=[override])


def test_a_coarser_block_charges_a_window_the_engines_pages_only() -> None:
    # DeepSeek-V4-Flash's engine page is 128 tokens. At a 512-token trace block the
    # layers that keep every block scale with the block, but a windowed group holds the
    # pages of its window as of the block's end: c128a's 128-token compressor state is
    # one 128-token page (20 layers x 128 x 4,104 B), not four; the sliding window one.
    g = preset("deepseek-v4-flash")
    coarse = g.with_block_size(512)
    by_kind = coarse.kind_bytes(coarse.layer_block_bytes)
    assert by_kind["c128a-state"] == 20 * 128 * 4104
    assert by_kind["c4a-state"] == 21 * 8 * 8208
    assert by_kind["sliding"] == 43 * 128 * 585
    assert by_kind["c4a"] == 4 * g.kind_bytes(g.layer_block_bytes)["c4a"]
    cached = sum(v for k, v in by_kind.items() if k != "sliding")
    assert cached == 14_252_544  # what a per-block store holds of one 512-token block
    assert coarse.layer_window_blocks == g.layer_window_blocks
    # The engine's own block and finer ones are unchanged; so is a model without windows.
    assert g.with_block_size(128) == g
    llama = preset("llama-3.1-8b")
    assert llama.with_block_size(512).layer_block_bytes == (512 * 4096,) * 32
    assert KVGeometry.from_record(coarse.to_record()) == coarse
