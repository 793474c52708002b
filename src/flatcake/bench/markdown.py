"""The ``flatcake bench`` report as markdown, for ``--docs-out`` (``flatcake.docsout``):
the layouts table, the device's and the write path's figures, the control plane's cost
and the bars, with the notes the run printed."""

from __future__ import annotations

from flatcake.bench.report import BenchReport, layers_text, size_text


def format_markdown(report: BenchReport) -> str:
    """What ``format_table`` prints, as markdown tables and lists."""
    lines = [
        f"{report.model}, {report.context_tokens} tokens in {report.num_turns} turns "
        f"({report.num_blocks} blocks x {layers_text(report.layer_block_bytes)}), "
        f"{report.rounds} rounds (medians), "
        f"{report.elapsed_s:.0f} s in all.",
        "",
        "| layout | GB/s | / device | read commands | bytes read | bytes useful | "
        "restore s | staging | CPU ns/B | verified | bytes / command |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in report.layouts:
        lines.append(
            f"| `{r.layout}` | {r.gbps:.3f} | {r.ratio_to_device:.2f} | {r.read_commands} | "
            f"{size_text(r.bytes_read)} | {size_text(r.bytes_useful)} | {r.restore_s:.3f} | "
            f"{size_text(r.staging_bytes)} | {r.cpu_ns_per_byte:.2f} | "
            f"{'yes' if r.verified else '**no**'} | {size_text(r.bytes_per_command)} |")
    d, w = report.device, report.write
    lines += [
        "",
        f"- Device: sequential read {d.seq_read_gbps:.3f} GB/s, sequential write "
        f"{d.seq_write_gbps:.3f} GB/s ({size_text(d.chunk_bytes)} x {d.in_flight} in "
        f"flight); random {size_text(d.rand_op_bytes)} reads {d.rand_read_gbps:.3f} GB/s "
        f"({d.rand_read_iops:.0f} IOPS).",
        "- fio: " + (", ".join(f"{name} {fig['gbps']:.3f} GB/s ({fig['iops']:.0f} IOPS)"
                               for name, fig in d.fio.items()) if d.fio else "not run") + ".",
        f"- Turn writes: {w.write_gbps:.3f} GB/s ({size_text(w.bytes_written)} in "
        f"{w.write_s:.2f} s) = {w.ratio_to_device:.2f} x the device's sequential write, "
        f"{w.cpu_ns_per_byte:.2f} CPU ns/B.",
    ]
    lines += [f"- Control plane, {c.context_tokens} tokens ({c.num_blocks} blocks, "
              f"{c.num_turns} turns): lookup and plan {c.lookup_and_plan_ms:.2f} ms = "
              f"{100 * c.fraction_of_restore:.2f}% of its restore ({c.restore_s:.2f} s"
              f"{', estimated' if c.estimated else ''})." for c in report.control_plane]
    lines += ["", "| bar | value | target | |", "|---|---:|---|---|"]
    lines += [f"| {b.name} | {b.value:.3f} | {b.op} {b.threshold:g} | "
              f"{'met' if b.passed else '**missed**'} |" for b in report.bars]
    if report.notes:
        lines += ["", *[f"- {n}" for n in report.notes]]
    return "\n".join(lines)
