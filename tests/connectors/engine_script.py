"""One engine process of the vLLM end-to-end test (run as a script by test_vllm_e2e.py).

    python engine_script.py model MODEL_DIR [KIND]
        build a tiny random model and its tokenizer (with a chat template) in MODEL_DIR
        (nothing downloaded): KIND ``llama`` (the default), ``mla`` (DeepSeek-V2-style
        multi-head latent attention: one 576-wide latent per token and layer, the width
        vLLM's CPU MLA kernel runs) or ``qwen3_next`` (Gated DeltaNet + attention);
        nothing to do when MODEL_DIR exists
    python engine_script.py serve MODEL_DIR PLAN.json OUT.json [STORE_DIR | unix:SOCKET]
        start vLLM's offline ``LLM`` (FlatCake on when STORE_DIR or a node service's
        socket is given: its ``kv_transfer_config`` is the only FlatCake-specific
        thing), serve the phases of
        PLAN.json in order, write every output to OUT.json and exit; builds the model
        first when MODEL_DIR does not exist yet

A plan is ``{"phases": [[request, ...], ...], "prefix_caching": bool (required: vLLM's
own prefix cache on or off; a run that checks FlatCake's hits wants it off, or vLLM
keeps the prefix itself and FlatCake rightly loads nothing),
"in_process": bool (default false: vLLM's default, the engine core in a child
process), "model_kind": KIND (default llama), "block_size": int (default 32; vLLM's CPU
MLA kernel takes 16 only; null: vLLM's choice), "dtype": str (default float32),
"cpu_mla_prefix_caching": bool (default false: vLLM's CPU
platform switches its prefix cache off for MLA models; true switches it back on, so a
baseline reuses cached latents through the same attention path a FlatCake hit
takes), "tensor_parallel_size": int (default 1), "short_reply_threshold_tokens": int
(default 512; FlatCake's embedded store, whose shared-prefix rule is on: 0 puts every
turn no other live request shares on SSD),
"release_windows_at_once": bool (default false: superseded window rows stay until the
SSD needs the space; true punches them as soon as a newer turn is durable), "window_rows":
str (``store.window_rows``; default: the store's)}``; a request is
``{"name", "prompt" (token ids) or "extend": [name, [new token ids]] (that request's
prompt + its output + new tokens), "session_id" and "cache_salt" (optional),
"max_tokens"}``. One phase is one ``generate`` call (its requests run concurrently).
"""

from __future__ import annotations

import json
import os
import sys
import time


def build_model(out: str, kind: str = "llama") -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(3, 512):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    # A chat template (for the OpenAI server's chat API): each message as "role text",
    # so a conversation's next prompt extends its previous prompt and reply.
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} "
                          "{% endfor %}{% if add_generation_prompt %}assistant{% endif %}")
    fast.save_pretrained(out)
    torch.manual_seed(0)
    if kind == "mla":
        from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

        # Dense layers only (first_k_dense_replace = all of them): the attention is what
        # matters here. kv_lora_rank + qk_rope_head_dim = 576, the CPU kernel's width.
        mla = DeepseekV2Config(
            vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
            kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=32,
            v_head_dim=32, first_k_dense_replace=2, n_routed_experts=4, num_experts_per_tok=2,
            n_shared_experts=1, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
            tie_word_embeddings=False)
        DeepseekV2ForCausalLM(mla).save_pretrained(out)
        return
    if kind == "qwen3_next":
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

        # 3 Gated DeltaNet layers + 1 full attention, bf16 (vLLM's CPU GDN kernel takes
        # bf16 and head dims of 64 only); lm_head untied: vLLM's Qwen3-Next does not tie
        # it, and a tied checkpoint leaves it unloaded (NaN logits).
        gdn = Qwen3NextConfig(
            vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
            linear_value_head_dim=64, linear_conv_kernel_dim=4, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=64,
            shared_expert_intermediate_size=64, full_attention_interval=4,
            max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=0,
            tie_word_embeddings=False)
        Qwen3NextForCausalLM(gdn).to(torch.bfloat16).save_pretrained(out)
        return
    if kind != "llama":
        raise SystemExit(f"unknown model kind {kind!r} (llama, mla, qwen3_next)")
    cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
                      tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(out)


def keep_cpu_mla_prefix_cache() -> None:
    """vLLM's CPU platform turns the prefix cache off for MLA models (its
    ``check_and_update_config``); turn it back on after that check, in this process."""
    from vllm.platforms.cpu import CpuPlatform

    check = CpuPlatform.check_and_update_config.__func__  # type: ignore[attr-defined]

    def check_keeping_prefix_cache(cls: type, vllm_config: object) -> None:
        check(cls, vllm_config)
        vllm_config.cache_config.enable_prefix_caching = True  # type: ignore[attr-defined]

    CpuPlatform.check_and_update_config = classmethod(check_keeping_prefix_cache)


def read_plan(plan_path: str) -> dict:
    """The plan at ``plan_path``; a plan that does not say whether vLLM's own prefix
    cache is on is refused by name."""
    with open(plan_path) as fh:
        plan = json.load(fh)
    if not isinstance(plan.get("prefix_caching"), bool):
        raise SystemExit(f"{plan_path}: the plan must set \"prefix_caching\" to true or "
                         "false (vLLM's own prefix cache; off where FlatCake's hits count)")
    return plan


def serve(model: str, plan_path: str, out_path: str, store: str | None) -> None:
    plan = read_plan(plan_path)
    from vllm import LLM, SamplingParams

    kwargs: dict = {}
    if store is not None and store.startswith("unix:"):
        kwargs["kv_transfer_config"] = {
            "kv_connector": "FlatCakeConnector",
            "kv_connector_module_path": "flatcake.connectors.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"store": {"node": store, "node_timeout_s": 2}},
        }
    elif store is not None:
        kwargs["kv_transfer_config"] = {
            "kv_connector": "FlatCakeConnector",
            "kv_connector_module_path": "flatcake.connectors.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "store": {"root": store, "memory_capacity_bytes": 64 << 20,
                          "ssd_capacity_bytes": 1 << 30, "session_file_bytes": 64 << 20,
                          "release_windows_at_once": plan.get("release_windows_at_once",
                                                              False),
                          **({"window_rows": plan["window_rows"]}
                             if "window_rows" in plan else {})},
                "placement": {"short_reply_threshold_tokens":
                              plan.get("short_reply_threshold_tokens", 512),
                              "shared_refcount_threshold": 2,
                              "memory_copy_watermark": 0.0},
            },
        }
    if plan.get("cpu_mla_prefix_caching"):
        keep_cpu_mla_prefix_cache()
    in_process = plan.get("in_process", False)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
    t0 = time.monotonic()
    if not os.path.isdir(model):
        build_model(model, plan.get("model_kind", "llama"))
    if plan.get("block_size", 32):
        kwargs["block_size"] = plan.get("block_size", 32)
    if plan.get("model_kind") == "mla":
        # vLLM's CPU platform picks its AMX MLA kernel on a CPU with AMX, which takes
        # 16-bit or 8-bit weights only; these models are float32: its reference CPU MLA
        # (what every other CPU gets) is asked for by name.
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
        kwargs["attention_backend"] = AttentionBackendEnum.CPU_MLA
    llm = LLM(model=model, dtype=plan.get("dtype", "float32"), enforce_eager=True,
              enable_prefix_caching=plan["prefix_caching"], max_model_len=1024,
              max_num_seqs=8, seed=0, disable_log_stats=store is None,
              tensor_parallel_size=plan.get("tensor_parallel_size", 1), **kwargs)
    started_s = time.monotonic() - t0
    done: dict[str, dict] = {}
    phase_s = []
    for phase in plan["phases"]:
        t1 = time.monotonic()
        prompts, params = [], []
        for req in phase:
            if "extend" in req:
                base, new = req["extend"]
                ids = done[base]["prompt"] + done[base]["tokens"] + new
            else:
                ids = req["prompt"]
            extra = {"kv_transfer_params": {"session_id": req["session_id"]}} \
                if req.get("session_id") else None
            prompt = {"prompt_token_ids": ids}
            if req.get("cache_salt"):
                prompt["cache_salt"] = req["cache_salt"]
            prompts.append(prompt)
            params.append(SamplingParams(temperature=0.0, max_tokens=req["max_tokens"],
                                         logprobs=1, ignore_eos=True, extra_args=extra))
        outs = llm.generate(prompts, params, use_tqdm=False)
        for req, prompt, out in zip(phase, prompts, outs, strict=True):
            comp = out.outputs[0]
            done[req["name"]] = {
                "prompt": prompt["prompt_token_ids"],
                "cache_salt": prompt.get("cache_salt"),
                "tokens": list(comp.token_ids),
                "logprobs": [lp[t].logprob for t, lp in zip(comp.token_ids, comp.logprobs,
                                                              strict=True)],
                "num_cached_tokens": out.num_cached_tokens,
                "flatcake": (out.kv_transfer_params or {}).get("flatcake"),
            }
        phase_s.append(round(time.monotonic() - t1, 3))
    result: dict = {"requests": done, "started_s": started_s, "phase_s": phase_s}
    with open(out_path, "w") as fh:
        json.dump(result, fh)
    # Exit as a user's script does: no FlatCake call; writes still in flight drain in
    # the connector's shutdown or its exit hook.


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if sys.argv[1] == "model":
        if not os.path.isdir(sys.argv[2]):
            build_model(sys.argv[2], *sys.argv[3:4])
    elif sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else None)
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}")
