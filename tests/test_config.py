"""The one configuration parser: every source (a TOML file, ``FLATCAKE_*`` variables,
``--set``, an engine's extra config) sets the same keys, the ``[engine]`` section
included, and refuses a bad key or value by name, in one error format."""

from __future__ import annotations

from pathlib import Path

import pytest

from flatcake.config import FlatCakeConfig, keys, load_config, load_extra_config
from flatcake.connectors.settings import parse_extra_config

VLLM = "kv_connector_extra_config"


def test_the_engine_section_is_set_by_every_source(tmp_path: Path) -> None:
    toml = tmp_path / "fc.toml"
    toml.write_text('[engine]\ntenant_salt = "from-toml"\nmin_hit_blocks = 2\n'
                    'cluster_lookup_first_keys = 16\n')
    cfg = load_config(toml, env={"FLATCAKE_ENGINE__MIN_HIT_BLOCKS": "3",
                                 "FLATCAKE_ENGINE__NODE_REATTACH_MAX_S": "12.5"},
                      overrides=["engine.max_sessions=7"])
    e = cfg.engine
    assert (e.tenant_salt, e.min_hit_blocks, e.cluster_lookup_first_keys) == \
        ("from-toml", 3, 16)  # the environment beats the file
    assert e.node_reattach_max_s == 12.5 and e.max_sessions == 7
    # The extra config wins over its config_file and the environment.
    extra = parse_extra_config({"config_file": str(toml), "tenant_salt": "from-extra"},
                               env={"FLATCAKE_ENGINE__MIN_HIT_BLOCKS": "3"})
    assert extra.engine.tenant_salt == "from-extra" and extra.engine.min_hit_blocks == 3


@pytest.mark.parametrize("extra", [
    {"tenant_salt": "t", "max_pending_stores": 9, "store": {"node_id": 2}},
    {"engine": {"tenant_salt": "t", "max_pending_stores": 9}, "store.node_id": 2},
    {"engine.tenant_salt": "t", "engine.max_pending_stores": "9", "store": {"node_id": "2"}},
])
def test_an_engine_key_bare_nested_or_dotted_is_the_same_key(extra: dict) -> None:
    want = load_config(env={}, overrides=["engine.tenant_salt=t",
                                          "engine.max_pending_stores=9", "store.node_id=2"])
    assert parse_extra_config(extra, env={}) == want


def test_vllm_and_sglang_read_the_same_section_with_the_same_parser() -> None:
    from flatcake.connectors.sglang_pool import SGLANG_KEYS, parse_sglang_config

    extra = {"tenant_salt": "team-a", "model_name": "m", "infer_sessions": False,
             "placement.not_yet": True, "store": {"root": "/x"}}
    vllm = parse_extra_config(extra, env={})
    assert parse_sglang_config({**extra, **dict.fromkeys(SGLANG_KEYS, 1)}, env={}) == vllm
    assert vllm.engine.model_name == "m" and vllm.engine.infer_sessions is False
    with pytest.raises(ValueError, match="unknown kv_connector_extra_config key "
                                         "'backend_name'"):
        parse_extra_config({"backend_name": "flatcake"}, env={})  # SGLang's, not vLLM's


@pytest.mark.parametrize("source, key", [
    ("toml", "store.roo"), ("env", "store.roo"), ("set", "store.roo"),
    ("toml", "engine.tenant_sal"), ("set", "engine.min_hit_block"),
])
def test_an_unknown_key_is_refused_by_name_with_the_closest_one(
        tmp_path: Path, source: str, key: str) -> None:
    section, name = key.split(".")
    path, env, overrides = None, {}, []
    if source == "toml":
        path = tmp_path / "fc.toml"
        path.write_text(f"[{section}]\n{name} = 1\n")
    elif source == "env":
        env = {f"FLATCAKE_{section.upper()}__{name.upper()}": "1"}
    else:
        overrides = [f"{key}=1"]
    with pytest.raises(ValueError) as err:
        load_config(path, env, overrides)
    close = next(k for k in keys() if k.startswith(key))
    assert str(err.value).startswith(f"unknown config key {key!r}; did you mean {close!r}?")


def test_an_unknown_extra_config_key_names_the_option_and_the_closest_key() -> None:
    with pytest.raises(ValueError) as err:
        parse_extra_config({"tenant_sallt": "x"}, env={})
    assert str(err.value).startswith(f"unknown {VLLM} key 'tenant_sallt'; did you mean "
                                     "'engine.tenant_salt'?")
    with pytest.raises(ValueError, match=f"{VLLM}.model is not accepted"):
        parse_extra_config({"model": "llama-3.1-8b"}, env={})


@pytest.mark.parametrize("key, value, error", [
    ("engine.min_hit_blocks", "0", "0: must be >= 1"),
    ("engine.in_step_load_timeout_s", "0", "0.0: must be > 0"),
    ("engine.shutdown_drain_s", "inf", "inf: must be a finite number"),
    ("engine.infer_sessions", "maybe", "'maybe': expected a boolean"),
    ("engine.node_reattach_max_s", "0.5", "0.5: must be >= engine.node_reattach_s"),
    ("engine.cluster_lookup_first_keys", "0", "0: must be >= 1"),
])
def test_a_bad_value_gets_one_error_naming_the_key_from_every_source(
        key: str, value: str, error: str) -> None:
    section, name = key.split(".")
    text = f"invalid config {key}={error}"
    with pytest.raises(ValueError) as err:
        load_config(env={}, overrides=[f"{key}={value}"])
    assert str(err.value) == text
    with pytest.raises(ValueError) as err:
        load_config(env={f"FLATCAKE_{section.upper()}__{name.upper()}": value})
    assert str(err.value) == text
    with pytest.raises(ValueError) as err:
        load_extra_config(VLLM, {name: value}, env={})
    assert str(err.value) == f"{VLLM}: {text}"


def test_a_negative_dense_span_of_window_rows_is_refused_by_name() -> None:
    with pytest.raises(ValueError) as err:
        load_config(env={}, overrides=["store.window_row_stride_dense_tokens=-1"])
    assert str(err.value) == ("invalid config store.window_row_stride_dense_tokens=-1: "
                              "must be >= 0 (0 = the stride everywhere)")


def test_a_non_scalar_value_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=rf"{VLLM}.store must be an object"):
        parse_extra_config({"store": 5}, env={})
    with pytest.raises(ValueError, match=rf"{VLLM}.store.root must be a single value"):
        parse_extra_config({"store": {"root": ["/a"]}}, env={})


def test_the_defaults_are_the_schema_defaults() -> None:
    assert load_config(env={}) == parse_extra_config({}, env={}) == FlatCakeConfig()


def test_a_session_file_span_must_leave_the_ssd_space_two_spans() -> None:
    assert load_config(env={}, overrides=[f"store.session_file_bytes={1 << 47}"])
    with pytest.raises(ValueError) as err:
        load_config(env={}, overrides=[f"store.session_file_bytes={1 << 48}"])
    assert str(err.value) == (f"invalid config store.session_file_bytes={1 << 48}: must be a "
                              "multiple of 4096 in [4096, 2**47] (the SSD space is 2**48 "
                              "bytes)")
