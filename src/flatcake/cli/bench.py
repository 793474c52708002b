"""``flatcake bench``: real restores on the disk at hand (see ``flatcake.bench``)."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterable
from typing import TYPE_CHECKING

from flatcake import docsout
from flatcake.geometry import PRESETS

if TYPE_CHECKING:
    from flatcake.bench.node import NodeBenchOptions
    from flatcake.bench.report import Bar
    from flatcake.bench.runner import BenchOptions

QUICK = {"context_tokens": 512, "num_turns": 2, "rounds": 1, "scattered_sessions": 2,
         "scale_tokens": 0, "use_fio": False}
"""``--quick``: a smoke run of a few seconds (CI): small request, one round, no fio and
no at-scale control-plane check. Explicit flags still win."""

NODE_QUICK = {"clients": 2, "sessions": 2, "blocks": 4, "rounds": 1, "calls": 20}
"""``--node --quick``: the node rows at a tiny size (CI)."""

CONNECTOR_QUICK = {"blocks": (8,), "requests": 5, "rounds": 1}
"""``--connector --quick``: the connector's rows at a tiny size (CI)."""

LOAD_QUICK = {"clients": 2, "rates": (20.0, 40.0), "seconds": 1.0}
"""``--node-load --quick``: two clients, two low rates, a second each (CI)."""


DESCRIPTION = ("Restore the same multi-turn session from FlatCake's session files, from "
               "an eviction-order (scattered) tier and from per-chunk files, all with the "
               "same O_DIRECT reader, next to the device's sequential ceiling and the same "
               "reads landing in the paged KV's slots (device-paged); report GB/s, read "
               "commands and bytes per layout.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default=".", help="directory on the disk to test (default: .)")
    p.add_argument("--model", default=None, choices=sorted(PRESETS),
                   help="geometry preset (default llama-3.1-8b)")
    p.add_argument("--context-tokens", type=int, default=None,
                   help="tokens of the restored session's history (default 8192)")
    p.add_argument("--turns", type=int, default=None, dest="num_turns",
                   help="turns the history was appended in (default 4)")
    p.add_argument("--rounds", type=int, default=None,
                   help="restores per layout, interleaved; medians reported (default 3)")
    p.add_argument("--chunk-tokens", type=int, default=None,
                   help="tokens per file of per-chunk-files (default 256, LMCache's)")
    p.add_argument("--scattered-sessions", type=int, default=None,
                   help="sessions interleaved in the eviction-order tier (default 3)")
    p.add_argument("--read-threads", type=int, default=None,
                   help="reader threads, the same for every layout (default 16)")
    p.add_argument("--scale-tokens", type=int, default=None,
                   help="request size of the control-plane-at-scale check, 0 to skip "
                        "(default 219000)")
    p.add_argument("--no-fio", action="store_false", dest="use_fio", default=None,
                   help="do not run fio even when it is installed")
    p.add_argument("--quick", action="store_true",
                   help="smoke run in a few seconds (512 tokens, 2 turns, 1 round, no fio)")
    p.add_argument("--keep", action="store_true", dest="keep_files",
                   help="keep the files written under --dir")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--calibrate", action="store_true",
                   help="instead of the layout comparison, measure the fixed cost of a "
                        "restore and the cost of one read command through the store under "
                        "--dir, write them to --calibration-out for the local replay preset "
                        "($FLATCAKE_CALIBRATION) and print them")
    p.add_argument("--calibration-out", default="flatcake-calibration.json",
                   help="file --calibrate writes (default: flatcake-calibration.json)")
    p.add_argument("--docs-out", default=None, metavar="FILE",
                   help="also write the report as markdown tables to FILE, under the "
                        "command, date, commit and machine (the docs site's "
                        "docs/results/generated/bench.md)")
    p.add_argument("--node", action="store_true",
                   help="instead of the layout comparison, the node service's rows: "
                        "--clients attached processes restoring at once against one, every "
                        "byte compared, and the scheduler half's CPU per call through "
                        "`flatcake serve` beside the embedded half's")
    p.add_argument("--clients", type=int, default=None,
                   help="--node: attached processes restoring at once (default 4); "
                        "--node-load: attached engine clients (default 8)")
    p.add_argument("--sessions", type=int, default=None,
                   help="--node: sessions written, one SSD turn each (default 8)")
    p.add_argument("--blocks", type=int, default=None,
                   help="--node: blocks per session (default 64)")
    p.add_argument("--calls", type=int, default=None,
                   help="--node: scheduler-half calls timed per figure (default 300)")
    p.add_argument("--connector", action="store_true",
                   help="instead of the layout comparison, the CPU the connector's "
                        "scheduler half costs per request and per prompt block (lookup, "
                        "admission, store) for new, vLLM-held and FlatCake-hit prompts, and "
                        "an idle step, embedded and through `flatcake serve`")
    p.add_argument("--prompt-blocks", default=None, metavar="N[,N...]",
                   help="--connector: prompt sizes in blocks (default 64,256)")
    p.add_argument("--requests", type=int, default=None,
                   help="--connector: requests timed per figure (default 200)")
    p.add_argument("--embedded-only", action="store_false", dest="through_node",
                   help="--connector: leave out the node service's rows")
    p.add_argument("--node-load", action="store_true",
                   help="instead of the layout comparison, the node service under load: "
                        "--clients attached engine clients (default 8) send lookups, "
                        "admissions and stores of 2K-token prompts at rising --rates until "
                        "the service saturates; p50/p99 latency per call, the service's "
                        "CPU per request and its books after each rate")
    p.add_argument("--rates", default=None, metavar="R[,R...]",
                   help="--node-load: total requests/s, in order (default "
                        "250,500,1000,2000,4000,8000)")
    p.add_argument("--seconds", type=float, default=None,
                   help="--node-load: seconds per rate (default 3)")
    p.add_argument("--p99-bound-ms", type=float, default=None,
                   help="--node-load: stop once p99 lookup latency passes it (default 20)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 when a bar is missed too (default: only when a restore "
                        "differs from the bytes written)")


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """Defaults < ``--quick`` < explicit flags."""
    from flatcake.bench.runner import BenchOptions

    values: dict[str, object] = dict(QUICK) if args.quick else {}
    for name in ("model", "context_tokens", "num_turns", "rounds", "chunk_tokens",
                 "scattered_sessions", "read_threads", "scale_tokens", "use_fio", "seed"):
        value = getattr(args, name)
        if value is not None:
            values[name] = value
    return BenchOptions(directory=args.dir, keep_files=args.keep_files,
                        **values)  # type: ignore[arg-type]


def command_line(options: BenchOptions, *, json_out: bool = False) -> str:
    """The explicit command that reproduces ``options`` (written into the report)."""
    parts = ["flatcake", "bench", "--dir", options.directory, "--model", options.model,
             "--context-tokens", str(options.context_tokens), "--turns",
             str(options.num_turns), "--rounds", str(options.rounds), "--chunk-tokens",
             str(options.chunk_tokens), "--scattered-sessions", str(options.scattered_sessions),
             "--read-threads", str(options.read_threads), "--scale-tokens",
             str(options.scale_tokens), "--seed", str(options.seed)]
    if not options.use_fio:
        parts.append("--no-fio")
    if json_out:
        parts.append("--json")
    return shlex.join(parts)


def node_options_from_args(args: argparse.Namespace) -> NodeBenchOptions:
    """``--node``: defaults < ``--quick`` < explicit flags."""
    from flatcake.bench.node import NodeBenchOptions

    values: dict[str, object] = dict(NODE_QUICK) if args.quick else {}
    for name in ("model", "clients", "sessions", "blocks", "rounds", "calls", "seed"):
        value = getattr(args, name)
        if value is not None:
            values[name] = value
    return NodeBenchOptions(directory=args.dir, keep_files=args.keep_files,
                            **values)  # type: ignore[arg-type]


def run(args: argparse.Namespace) -> int:
    if args.calibrate:
        return calibrate(args)
    if args.node:
        return node(args)
    if args.connector:
        return connector(args)
    if args.node_load:
        return node_load(args)
    from flatcake.bench.report import dump_json, format_table
    from flatcake.bench.runner import run_bench

    options = options_from_args(args)
    started = docsout.start()
    report = run_bench(options, command=command_line(options, json_out=args.json))
    print(dump_json(report) if args.json else format_table(report))
    if args.docs_out:
        from flatcake.bench.markdown import format_markdown

        argv = [*shlex.split(command_line(options)), "--docs-out", args.docs_out]
        docsout.write(args.docs_out, argv, format_markdown(report), started)
    return exit_status((r.verified for r in report.layouts), report.bars,
                       strict=args.strict)


def exit_status(verified: Iterable[bool], bars: Iterable[Bar], *, strict: bool) -> int:
    """1 when a restore was not byte-exact, or (``strict``) when a bar was missed: the
    exit of every bench report (the layouts and the node rows)."""
    if not all(verified):
        return 1
    return 1 if strict and not all(b.passed for b in bars) else 0


def node(args: argparse.Namespace) -> int:
    """``--node``: run the node rows, print them; exit as the layout comparison does."""
    import json

    from flatcake.bench.node import format_node_markdown, format_node_table, run_node_bench

    started = docsout.start()
    options = node_options_from_args(args)
    parts = ["flatcake", "bench", "--node", "--dir", options.directory, "--model",
             options.model, "--clients", str(options.clients), "--sessions",
             str(options.sessions), "--blocks", str(options.blocks), "--rounds",
             str(options.rounds), "--calls", str(options.calls), "--seed", str(options.seed)]
    report = run_node_bench(options, command=shlex.join(parts))
    print(json.dumps(report.to_json(), indent=2) if args.json else format_node_table(report))
    if args.docs_out:
        docsout.write(args.docs_out, [*parts, "--docs-out", args.docs_out],
                      format_node_markdown(report), started)
    return exit_status((r.verified for r in report.restores), report.bars,
                       strict=args.strict)


def connector(args: argparse.Namespace) -> int:
    """``--connector``: run the scheduler half's rows, print them; exit 1 only under
    ``--strict`` when a bar is missed (nothing is restored)."""
    import json

    from flatcake.bench.connector import (
        ConnectorBenchOptions,
        format_connector_markdown,
        format_connector_table,
        run_connector_bench,
    )

    values: dict[str, object] = dict(CONNECTOR_QUICK) if args.quick else {}
    if args.prompt_blocks is not None:
        try:
            values["blocks"] = tuple(int(b) for b in args.prompt_blocks.split(","))
        except ValueError:
            raise ValueError(f"--prompt-blocks must be ints separated by commas, got "
                             f"{args.prompt_blocks!r}") from None
    for name in ("model", "requests", "rounds", "seed"):
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    options = ConnectorBenchOptions(directory=args.dir, node=args.through_node,
                                    **values)  # type: ignore[arg-type]
    parts = ["flatcake", "bench", "--connector", "--dir", options.directory, "--model",
             options.model, "--prompt-blocks", ",".join(map(str, options.blocks)),
             "--requests", str(options.requests), "--rounds", str(options.rounds),
             "--seed", str(options.seed), *([] if options.node else ["--embedded-only"])]
    started = docsout.start()
    report = run_connector_bench(options, command=shlex.join(parts))
    print(json.dumps(report.to_json(), indent=2) if args.json
          else format_connector_table(report))
    if args.docs_out:
        docsout.write(args.docs_out, [*parts, "--docs-out", args.docs_out],
                      format_connector_markdown(report), started)
    return exit_status((), report.bars, strict=args.strict)


def node_load(args: argparse.Namespace) -> int:
    """``--node-load``: rising rates against one service; print the rows and the
    saturation rate; exit 1 when the books were not clean after a rate."""
    import json
    import os

    from flatcake.bench.node_load import (
        LoadOptions,
        format_load_markdown,
        format_load_table,
        run_node_load,
    )

    values: dict[str, object] = dict(LOAD_QUICK) if args.quick else {}
    if args.rates is not None:
        try:
            values["rates"] = tuple(float(r) for r in args.rates.split(","))
        except ValueError:
            raise ValueError(f"--rates must be numbers separated by commas, got "
                             f"{args.rates!r}") from None
    for name in ("model", "clients", "seconds", "p99_bound_ms", "seed"):
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    options = LoadOptions(directory=args.dir, **values)  # type: ignore[arg-type]
    started = docsout.start()
    load0 = os.getloadavg()[0]
    rows, saturation = run_node_load(options)
    load = (load0, os.getloadavg()[0])
    if args.json:
        print(json.dumps({"saturation_per_s": saturation, "rows": [
            {"offered": r.offered, "delivered": r.delivered, "requests": r.requests,
             "calls": {c: len(r.latencies_ms[c]) for c in r.latencies_ms},
             "p50_ms": {c: r.pct(c, 0.5) for c in r.latencies_ms},
             "p99_ms": {c: r.pct(c, 0.99) for c in r.latencies_ms},
             "service_cpu_us": r.service_cpu_us, "clients_cpu_us": r.clients_cpu_us,
             "books": r.books,
             "books_clean": r.books_clean} for r in rows]}, indent=2))
    else:
        print(format_load_table(rows, saturation, options, load))
    if args.docs_out:
        parts = ["flatcake", "bench", "--node-load", "--dir", options.directory, "--model",
                 options.model, "--clients", str(options.clients), "--rates",
                 ",".join(f"{r:g}" for r in options.rates), "--seconds",
                 f"{options.seconds:g}", "--p99-bound-ms", f"{options.p99_bound_ms:g}",
                 "--seed", str(options.seed), "--docs-out", args.docs_out]
        docsout.write(args.docs_out, parts,
                      format_load_markdown(rows, saturation, options, load), started)
    return 0 if all(r.books_clean for r in rows) else 1


def calibrate(args: argparse.Namespace) -> int:
    """``--calibrate``: measure, write the file, print the numbers and how to use them."""
    from flatcake.bench.calibrate import measure_restore_costs, preset_snippet, write_calibration

    rounds = 3 if args.quick else (args.rounds or 15)
    costs = measure_restore_costs(args.dir, rounds=rounds,
                                  read_threads=args.read_threads or 4)
    path = write_calibration(args.calibration_out, costs)
    print(preset_snippet(costs, path))
    return 0
