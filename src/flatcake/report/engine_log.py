"""The engine a loadgen run was measured on, read back from what the engine left.

vLLM's server log says how big its prefix cache was (``GPU KV cache size: N tokens``, or
``CPU KV cache size`` on the CPU platform), its block size and the model it served (the
``non-default args`` line, and ``num_gpu_blocks_override`` when the cache was capped);
the model's ``config.json`` gives the KV geometry (layers, KV heads, head dim) and the
element type when the log names none. A FlatCake server's log also holds the store's
memory and SSD budgets (its KV transfer config) and whether an SSD hit loads in the step
that schedules it: the connector's own line (``connectors.settings.IN_STEP_LINE``, the
effective value) first; in an older log without it, the connector's ``ssd_loads_in_step``
where the config sets it, else its default (``True``), which it applies only where the KV
cache is on a CPU (the log's ``CPU KV cache size``). ``report.realcheck`` builds its
replay engine from
these, so the check replays the engine that ran, not the flags it was meant to have.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from flatcake.geometry import DTYPE_BYTES, KVGeometry

CACHE_TOKENS = re.compile(r"\b(GPU|CPU|XPU) KV cache size: ([\d,]+) tokens")
IN_STEP = re.compile(r"'ssd_loads_in_step': (True|False)")
# The line the connector logs at start (``connectors.settings.IN_STEP_LINE``; read as
# text, like vLLM's own lines: tests/report/test_engine_log.py checks they agree).
IN_STEP_SAID = re.compile(r"FlatCake ssd_loads_in_step effective: (True|False) \(([^)\n]*)\)")
OVERRIDE = re.compile(r"with num_gpu_blocks_override=(\d+)")
NON_DEFAULT = re.compile(r"non-default args: (\{.*\})\s*$", re.M)
ARG = re.compile(r"'(\w+)': ('[^']*'|\d+)")
DTYPES = {"float": "float32", "half": "float16", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class EngineFacts:
    """vLLM's prefix cache and the model's KV, as the engine reported them."""

    cache_blocks: int
    block_tokens: int
    geometry: KVGeometry
    source: str
    flatcake_memory_bytes: int | None = None
    flatcake_ssd_bytes: int | None = None
    model: str = ""
    ssd_loads_in_step: bool = False
    in_step_source: str = ""

    def describe(self) -> str:
        g = self.geometry
        model = f"model {self.model}: " if self.model else ""
        return (f"{model}{self.cache_blocks} blocks of {self.block_tokens} tokens, "
                f"{g.num_layers} layers x {g.num_kv_heads} KV heads x {g.head_dim} {g.dtype} "
                f"({g.bytes_per_token:,} B per token)")


def _args(text: str) -> dict[str, str]:
    """The ``non-default args`` line's plain values by key (a value that is an object's
    repr, such as the KV transfer config, is searched for the keys inside it too)."""
    m = NON_DEFAULT.search(text)
    if m is None:
        return {}
    return {k: v.strip("'") for k, v in ARG.findall(m.group(1))}


def _dtype(*names: object) -> str | None:
    for name in names:
        if isinstance(name, str) and name not in ("auto", ""):
            n = name.removeprefix("torch.")
            n = DTYPES.get(n, n)
            if n in DTYPE_BYTES:
                return n
    return None


def model_geometry(model: Path, block_tokens: int, dtype: str | None) -> KVGeometry:
    """The KV geometry of the model in folder ``model`` (its ``config.json``)."""
    path = model / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read the model's config ({e}); the engine's "
                         "model must be a local folder") from None
    cfg = cfg.get("text_config", cfg)
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: no {e} to size the KV cache from (num_hidden_layers, "
                         "num_attention_heads, num_key_value_heads, head_dim or "
                         "hidden_size)") from None
    kind = _dtype(dtype, cfg.get("dtype"), cfg.get("torch_dtype"))
    if kind is None:
        raise ValueError(f"{path}: names no element type the KV cache could have "
                         f"(dtype / torch_dtype), nor did the server log")
    return KVGeometry(num_layers=layers, tokens_per_block=block_tokens,
                      num_kv_heads=kv_heads, head_dim=head_dim, dtype=kind, name=model.name)


def read_engine(log: Path) -> EngineFacts:
    """What ``log`` (a vLLM server's log) and its model's ``config.json`` say; a
    ``ValueError`` naming what is missing otherwise."""
    try:
        text = log.read_text(errors="replace")
    except OSError as e:
        raise ValueError(f"{log}: cannot read the server log ({e})") from None
    m = CACHE_TOKENS.search(text)
    if m is None:
        raise ValueError(f"{log}: no 'KV cache size: N tokens' line (did the server start?)")
    tokens = int(m.group(2).replace(",", ""))
    args = _args(text)
    override = OVERRIDE.search(text)
    block = int(args["block_size"]) if args.get("block_size", "").isdigit() else 0
    if not block and override is not None:
        block = tokens // int(override.group(1))
    if block <= 0:
        raise ValueError(f"{log}: names no block size (the 'non-default args' line has no "
                         "block_size and the cache was not capped by "
                         "num_gpu_blocks_override)")
    model = args.get("model")
    if not model:
        raise ValueError(f"{log}: names no model folder (no 'model' in the 'non-default "
                         "args' line)")
    geometry = model_geometry(Path(model), block, _dtype(args.get("kv_cache_dtype"),
                                                         args.get("dtype")))
    budgets = {k: int(args[k]) for k in ("memory_capacity_bytes", "ssd_capacity_bytes")
               if args.get(k, "").isdigit()}
    in_step, how = False, ""
    said = IN_STEP_SAID.search(text)
    if said is not None:
        in_step = said.group(1) == "True"
        how = (f"SSD hits {'loaded in the step' if in_step else 'restored before the step'}"
               f" (the connector's log: {said.group(2)})")
    elif "FlatCakeConnector" in text:
        setting = IN_STEP.search(text)
        in_step = m.group(1) == "CPU" and (setting is None or setting.group(1) == "True")
        how = (f"SSD hits {'loaded in the step' if in_step else 'restored before the step'}"
               f" ({m.group(1)} KV cache, ssd_loads_in_step "
               + ("not set: the connector's default True" if setting is None
                  else f"{setting.group(1)} in the log") + ")")
    return EngineFacts(tokens // block, block, geometry, log.name,
                       budgets.get("memory_capacity_bytes"), budgets.get("ssd_capacity_bytes"),
                       model, in_step, how)
