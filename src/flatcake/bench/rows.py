"""The bench's result rows: one ``LayoutResult`` per layout from its rounds (medians, the
ratio to the device's sequential read), and the bars those rows are judged by.

The restore bars (issue 41): FlatCake's restore against the ``device`` row (the raw
device's sequential read into one staging buffer per command, the ceiling of this disk)
and, like with like, against the ``device-paged`` row (the same commands with the paged
KV's slots as destination: one iovec per block, as a zero-copy restore must read), each
>= ``RESTORE_BAR``; and the restore's CPU per byte kept <= ``RESTORE_CPU_NS_PER_BYTE``.
A gap between the two device rows is the destination's cost on this disk, which no
restore into the paged KV can avoid; a gap to ``device-paged`` is FlatCake's own.
"""

from __future__ import annotations

from flatcake.bench.program import ProgramRun
from flatcake.bench.report import Bar, ControlPlaneCost, LayoutResult, WritePath, median

RESTORE_BAR = 0.95  # of the device's sequential read, in the same run
RESTORE_CPU_NS_PER_BYTE = 0.1  # CPU (all threads) per byte restored


def by_name(rows: list[LayoutResult], name: str) -> LayoutResult:
    return next(r for r in rows if r.layout == name)


def layout_rows(names: tuple[str, ...], runs: dict[str, list[ProgramRun]],
                 cpu: dict[str, list[float]],
                 staging: dict[str, int],
                 verified: dict[str, bool], useful: int
                 ) -> list[LayoutResult]:
    rows: list[LayoutResult] = []
    device_gbps = 0.0
    for name in names:
        times = tuple(r.seconds for r in runs[name])
        restore_s = median(times)
        last = runs[name][-1]
        moved = last.bytes_read if name.startswith("device") else useful
        gbps = moved / restore_s / 1e9 if restore_s > 0 else 0.0
        if name == "device":
            device_gbps = gbps
        rows.append(LayoutResult(
            layout=name, restore_s=restore_s, restore_s_runs=times, gbps=gbps,
            ratio_to_device=gbps / device_gbps if device_gbps else 0.0,
            read_commands=last.read_commands, bytes_read=last.bytes_read,
            bytes_useful=moved, staging_bytes=staging.get(name, 0), cpu_s=median(cpu[name]),
            verified=verified[name]))
    return rows


def bench_bars(layouts: list[LayoutResult], controls: list[ControlPlaneCost], num_layers: int,
          num_turns: int, write: WritePath) -> list[Bar]:
    by = {r.layout: r for r in layouts}
    fc, sc = by["flatcake"], by["scattered"]
    bars = [Bar("flatcake restore / device sequential read", fc.ratio_to_device, ">=",
                RESTORE_BAR)]
    if "device-paged" in by:  # not run where the paged KV refuses O_DIRECT
        dp = by["device-paged"]
        bars.append(Bar("flatcake restore / device-paged read (same destination)",
                        fc.gbps / dp.gbps if dp.gbps else 0.0, ">=", RESTORE_BAR))
    bars += [
        Bar("flatcake restore CPU ns per byte", fc.cpu_ns_per_byte, "<=",
            RESTORE_CPU_NS_PER_BYTE),
        Bar("flatcake speed-up over scattered", fc.gbps / sc.gbps if sc.gbps else 0.0,
            ">=", 2.0),
        Bar("flatcake read_commands / (layers x turns)",
            fc.read_commands / (num_layers * num_turns), "<=", 1.0),
    ]
    bars.append(Bar("flatcake turn write / device sequential write", write.ratio_to_device,
                    ">=", 0.8))
    for c in controls:
        bars.append(Bar(f"control plane / restore at {c.context_tokens} tokens",
                        c.fraction_of_restore, "<=", 0.05))
    bars.append(Bar("every restore verified",
                    float(all(r.verified for r in layouts)), ">=", 1.0))
    return bars
