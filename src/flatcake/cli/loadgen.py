"""``flatcake loadgen``: drive a live OpenAI-compatible server with a session workload.

Measures what users judge a KV cache by: TTFT and the share of prompt tokens the server
served from its cache. See ``flatcake.loadgen`` and docs/loadgen.md."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flatcake.loadgen import Reply, Workload

DESCRIPTION = ("Send a workload (the built-in agent/chat/mixed sessions, a trace file, or "
               "a working set of long prompts) to an OpenAI-compatible server over "
               "streaming /v1/completions (or /v1/chat/completions) at a rate or a "
               "concurrency; write per-request JSONL, summary.json and a TTFT plot to "
               "--out and print TTFT p50/p95/p99, the cached share and req/s. Exit 0 when "
               "every request succeeded, 1 when some failed, 2 when the server cannot be "
               "reached or an option is wrong.")
DEFAULT_URL = "http://127.0.0.1:8000"
KINDS = ("agent", "chat", "mixed")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", nargs="?", default=DEFAULT_URL,
                   help=f"the server's root URL (default {DEFAULT_URL})")
    w = p.add_argument_group("workload (default: the built-in agent sessions)")
    w.add_argument("--workload", default=None, choices=KINDS,
                   help="built-in generated sessions (flatcake replay's workloads)")
    w.add_argument("--trace", default=None,
                   help="trace file (Claude Code, Mooncake, native; gzip ok)")
    w.add_argument("--format", default=None, help="trace format (default: detected)")
    w.add_argument("--sessions", type=int, default=None,
                   help="use the first N sessions (a trace without sessions: N requests); "
                        "built-in default: flatcake replay's")
    w.add_argument("--block-tokens", type=int, default=None,
                   help="tokens per block id (default: the trace's block size, scaled "
                        "down until 90%% of the requests fit the context; longer ones "
                        "are cut)")
    w.add_argument("--working-set", type=int, default=None, metavar="N",
                   help="instead: N distinct prompts revisited, each visit with its own "
                        "short question")
    w.add_argument("--prompt-tokens", type=int, default=2048,
                   help="working set: tokens per prompt (default 2048)")
    w.add_argument("--suffix-tokens", type=int, default=32,
                   help="working set: tokens of each visit's own question (default 32)")
    w.add_argument("--order", default="round_robin", choices=("round_robin", "random"),
                   help="working set: visit order (default round_robin)")
    w.add_argument("--seed", type=int, default=0,
                   help="seeds the tokens, the built-in workload and the arrivals; a new "
                        "seed sends prompts a warm server has not seen")
    r = p.add_argument_group("requests and pacing")
    r.add_argument("--model", default=None, help="model name (default: the server's first)")
    r.add_argument("--api", default="completions", choices=("completions", "chat"),
                   help="completions: token-id prompts to /v1/completions (default); chat: "
                        "each prompt as one user message to /v1/chat/completions, a word "
                        "per token id, as a chat client sends it")
    r.add_argument("--max-tokens", type=int, default=16,
                   help="output tokens per request (default 16)")
    r.add_argument("--max-model-len", type=int, default=None,
                   help="context length prompts are fitted to (default: the server's)")
    r.add_argument("--vocab-size", type=int, default=32000,
                   help="prompt token ids are drawn from [3, N) (default 32000)")
    r.add_argument("--rate", type=float, default=None,
                   help="open loop: Poisson arrivals, requests/s (default: closed loop)")
    r.add_argument("--concurrency", type=int, default=None,
                   help="closed loop: sessions in flight (default 1); with --rate: most "
                        "requests in flight (default 64)")
    r.add_argument("--duration", type=float, default=60.0,
                   help="stop sending after this many seconds (default 60; 0: no limit)")
    r.add_argument("--max-requests", type=int, default=None, help="stop after N requests")
    r.add_argument("--warmup", type=int, nargs="?", const=0, default=None, metavar="N",
                   help="first send the workload's first N requests, not measured "
                        "(warmup.jsonl); the measured run goes on with the requests after "
                        "them. Without N: one visit of each --working-set prompt")
    r.add_argument("--timeout", type=float, default=120.0,
                   help="seconds one request may take (default 120)")
    r.add_argument("--session-ids", action="store_true",
                   help="send each session's id as kv_transfer_params.session_id "
                        "(FlatCake's vLLM connector groups a session's turns by it)")
    r.add_argument("--no-ignore-eos", action="store_true",
                   help="do not send ignore_eos (for servers that reject it)")
    r.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                   help="bearer token (default: $OPENAI_API_KEY)")
    o = p.add_argument_group("output")
    o.add_argument("--out", default="loadgen-out", help="output directory")
    o.add_argument("--label", default=None, help="a name for this run in summary.json")
    o.add_argument("--json", action="store_true", help="print summary.json, no table")
    o.add_argument("--no-plots", action="store_true", help="skip ttft.png")


def _positive(name: str, value: int | float | None) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def _workload(args: argparse.Namespace, budget: int) -> Workload:
    from flatcake.loadgen import TokenSpace, builtin_trace, trace_workload, working_set

    tokens = TokenSpace(args.vocab_size, args.seed)
    if args.working_set is not None:
        return working_set(num_prompts=args.working_set, prompt_tokens=args.prompt_tokens,
                           suffix_tokens=args.suffix_tokens, max_tokens=args.max_tokens,
                           tokens=tokens, budget_tokens=budget, order=args.order,
                           seed=args.seed)
    if args.trace is not None:
        from flatcake.traces import read_trace

        trace = read_trace(args.trace, format=args.format)
    else:
        trace = builtin_trace(args.workload or "agent", args.sessions, args.seed)
    return trace_workload(trace, budget_tokens=budget, max_tokens=args.max_tokens,
                          tokens=tokens, block_tokens=args.block_tokens,
                          sessions=args.sessions if args.trace is not None else None)


def _check(args: argparse.Namespace) -> None:
    """Option mistakes, before the server is asked anything."""
    chosen = [n for n, v in (("--workload", args.workload), ("--trace", args.trace),
                             ("--working-set", args.working_set)) if v is not None]
    if len(chosen) > 1:
        raise ValueError(f"choose one workload: {' and '.join(chosen)} were both given")
    for name in ("max_tokens", "max_model_len", "concurrency", "max_requests", "timeout",
                 "block_tokens", "sessions"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    if args.duration < 0:
        raise ValueError(f"--duration must be >= 0 s, got {args.duration}")
    if args.format is not None and args.trace is None:
        raise ValueError("--format applies to --trace only")
    if args.warmup is not None and args.warmup < 0:
        raise ValueError(f"--warmup must be >= 1 requests, got {args.warmup}")
    if args.warmup == 0 and args.working_set is None:
        raise ValueError("--warmup without N applies to --working-set only; give "
                         "--warmup N requests")


def run(args: argparse.Namespace) -> int:
    from flatcake import progress
    from flatcake.loadgen import (
        Endpoint,
        Pacing,
        chat_body,
        completion_body,
        probe,
        stream_completion,
    )
    from flatcake.loadgen import driver as drive
    from flatcake.loadgen.output import (
        WARMUP_FILE,
        plot,
        record_log,
        write_page,
        write_summary,
    )
    from flatcake.loadgen.summary import summarize, table

    _check(args)
    endpoint = Endpoint.parse(args.url, args.api_key)
    pacing = Pacing(rate=args.rate,
                    concurrency=args.concurrency or (64 if args.rate is not None else 1),
                    duration_s=args.duration or None, max_requests=args.max_requests,
                    seed=args.seed)
    info = probe(endpoint, min(args.timeout, 30.0))
    model = args.model or info.model
    max_len = args.max_model_len or info.max_model_len
    if max_len is None:
        raise ValueError(f"{endpoint.url} does not report its max_model_len; pass "
                         "--max-model-len")
    budget = max_len - args.max_tokens
    workload = _workload(args, budget)
    say = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    mode = (f"open loop at {args.rate:g} req/s (at most {pacing.concurrency} in flight)"
            if args.rate is not None else f"closed loop, concurrency {pacing.concurrency}")
    bounds = ", ".join(b for b in (
        f"{args.duration:g} s" if args.duration else "",
        f"{args.max_requests} requests" if args.max_requests else "") if b) or "no bound"
    say(f"loadgen: {endpoint.url} model {model} (max_model_len {max_len})")
    say(f"workload: {workload.description}")
    say(f"pacing: {mode}, until {bounds}")

    make_body = chat_body if args.api == "chat" else completion_body

    def send(job: drive.Job, prompt: list[int]) -> Reply:
        body = make_body(model, prompt, job.turn.max_tokens,
                         session_id=job.session_id if args.session_ids else None,
                         ignore_eos=not args.no_ignore_eos)
        return stream_completion(endpoint, body, args.timeout)

    out = Path(args.out)
    warmup = (args.warmup or args.working_set) if args.warmup is not None else 0
    seen: set[int] = set()  # block ids sent: what the measured run may find reused
    if warmup:
        say(f"warm-up: the first {warmup} requests, not measured")
        warm = replace(pacing, duration_s=None, max_requests=warmup)
        bar = progress.task("warm-up", warmup, "req")
        with record_log(out, WARMUP_FILE) as log:
            def on_warm(rec: drive.Record) -> None:
                log(rec)
                bar.update(1)

            warmed = drive.run(workload, warm, send, on_warm, seen)
        bar.close()
        if warmed.aborted or warmed.interrupted:
            print(f"flatcake loadgen: warm-up stopped: {warmed.aborted or 'interrupted'}",
                  file=sys.stderr)
            return 1 if warmed.aborted else 130
    limits = [n for n in (workload.num_requests, args.max_requests) if n is not None]
    bar = progress.task("loadgen", min(limits) if limits else None, "req")
    with record_log(out) as log:
        def on_record(rec: drive.Record) -> None:
            log(rec)
            bar.update(1)

        result = drive.run(workload, pacing, send, on_record, seen)
    bar.close()
    summary = summarize(result.records, result.wall_s)
    meta = {"label": args.label, "url": endpoint.url, "model": model,
            "max_model_len": max_len, "workload": workload.description,
            "workload_meta": workload.meta, "block_tokens": workload.block_tokens,
            "num_cut": workload.num_cut, "pacing": mode, "bounds": bounds,
            "max_tokens": args.max_tokens, "session_ids": args.session_ids, "api": args.api,
            "warmup_requests": warmup,
            "seed": args.seed, "interrupted": result.interrupted, "aborted": result.aborted}
    write_summary(out, summary, meta)
    picture = None if args.no_plots else plot(out, result.records, workload.description)
    write_page(out, summary, meta, picture)
    if args.json:
        print(json.dumps({"summary": summary.to_json(), "run": meta}, indent=2))
    else:
        print()
        print(table(summary))
        print(f"wrote {out}/report.html (open it in a browser), requests.jsonl, summary.json"
              + (f", {picture.name}" if picture else ""))
    if result.aborted:
        print(f"flatcake loadgen: error: {result.aborted}", file=sys.stderr)
        return 1
    if result.interrupted:
        print("flatcake loadgen: interrupted (the records so far are written)",
              file=sys.stderr)
        return 130
    return 1 if summary.errors else 0
