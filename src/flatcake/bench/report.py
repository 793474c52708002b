"""Results of ``flatcake bench``: value types, the bars, the table and the JSON document.

Units: throughput in decimal GB/s (1e9 B/s, as fio reports), times in seconds unless
the name says ``_ms``. A layout's ``gbps`` is the *useful* bytes of the restored request
over its restore time: what an engine waiting for the KV gets, whatever the layout had
to read to deliver it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flatcake.progress import size_text


@dataclass(frozen=True, slots=True)
class LayoutResult:
    """One layout's restore of the request, over all rounds.

    Attributes:
        layout: ``device``, ``flatcake``, ``scattered`` or ``per-chunk-files``.
        restore_s: median restore time over the rounds.
        restore_s_runs: every round's restore time, in round order.
        gbps: ``bytes_useful / restore_s``.
        ratio_to_device: ``gbps`` over the device row's ``gbps`` (same run).
        read_commands: read commands of one restore (from the reader's counters).
        bytes_read: bytes one restore read (useful + gaps + alignment + checks).
        bytes_useful: bytes of the request the engine needs (every block of every
            layer, a windowed layer's last window only: ``KVGeometry.restore_bytes``).
        staging_bytes: largest staging buffer the restore needed (one of two).
        verified: every round's restored bytes equal the bytes written.
        cpu_s: median CPU seconds of this process (all threads) during one restore;
            ``cpu_s / bytes_useful`` says whether a restore is bound by the CPU (on a
            2-core machine, more than ~1 ns per byte cannot keep up with 2 GB/s).
    """

    layout: str
    restore_s: float
    restore_s_runs: tuple[float, ...]
    gbps: float
    ratio_to_device: float
    read_commands: int
    bytes_read: int
    bytes_useful: int
    staging_bytes: int
    verified: bool
    cpu_s: float = 0.0

    @property
    def cpu_ns_per_byte(self) -> float:
        return 1e9 * self.cpu_s / self.bytes_useful if self.bytes_useful else 0.0

    @property
    def bytes_per_command(self) -> int:
        """Average size of one read command of a restore."""
        return self.bytes_read // self.read_commands if self.read_commands else 0


@dataclass(frozen=True, slots=True)
class DeviceFigures:
    """The disk under ``--dir``, measured in this run.

    Attributes:
        seq_read_gbps: median in-process sequential O_DIRECT read (the ``device`` row).
        seq_write_gbps: in-process sequential O_DIRECT write + fsync of the device file.
        chunk_bytes: command size of the sequential runs.
        in_flight: commands outstanding in the sequential runs.
        rand_read_gbps: random O_DIRECT reads of ``rand_op_bytes`` (one block of one
            layer: the scattered layout's command), ``in_flight`` outstanding.
        rand_read_iops: the same run's commands per second.
        rand_op_bytes: the random reads' size.
        fio: fio's figures by job name (``read``, ``write``, ``randread``), decimal
            GB/s; empty without fio.
    """

    seq_read_gbps: float
    seq_write_gbps: float
    chunk_bytes: int
    in_flight: int
    rand_read_gbps: float
    rand_read_iops: float
    rand_op_bytes: int
    fio: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ControlPlaneCost:
    """Lookup + read planning of one request, no I/O (median of repeats).

    Attributes:
        context_tokens: tokens of the request.
        num_blocks: blocks looked up.
        num_turns: segments (turns) the history is stored in.
        lookup_and_plan_ms: index lookup of the request's keys + ``plan_reads``.
        restore_s: the request's restore time (measured, or estimated when ``estimated``).
        estimated: ``restore_s`` is the request's bytes at the flatcake row's measured
            GB/s, because the request is too large to restore on this machine.
        fraction_of_restore: ``lookup_and_plan_ms / 1000 / restore_s``.
    """

    context_tokens: int
    num_blocks: int
    num_turns: int
    lookup_and_plan_ms: float
    restore_s: float
    estimated: bool
    fraction_of_restore: float


@dataclass(frozen=True, slots=True)
class WritePath:
    """FlatCake writing the session's turns (``cio.writer``: O_DIRECT commands in flight
    straight from the paged KV slots, or gathered into huge-page buffers; see the
    "flatcake write path" note).

    Attributes:
        bytes_written: segment bytes written (headers and padding included).
        write_s: wall time of all turn writes.
        write_gbps: ``bytes_written / write_s``.
        device_write_gbps: the device's sequential write in the same run.
        ratio_to_device: ``write_gbps / device_write_gbps``.
        cpu_s: CPU seconds of this process (all threads) during all turn writes.
    """

    bytes_written: int
    write_s: float
    write_gbps: float
    device_write_gbps: float
    ratio_to_device: float
    cpu_s: float = 0.0

    @property
    def cpu_ns_per_byte(self) -> float:
        return 1e9 * self.cpu_s / self.bytes_written if self.bytes_written else 0.0


@dataclass(frozen=True, slots=True)
class Bar:
    """One acceptance bar: ``value`` compared with ``threshold`` (``op`` is >= or <=)."""

    name: str
    value: float
    op: str
    threshold: float

    @property
    def passed(self) -> bool:
        return self.value >= self.threshold if self.op == ">=" else self.value <= self.threshold


@dataclass(frozen=True, slots=True)
class BenchReport:
    """Everything one ``flatcake bench`` run measured."""

    command: str
    directory: str
    model: str
    num_layers: int
    layer_block_bytes: tuple[int, ...]
    tokens_per_block: int
    context_tokens: int
    num_turns: int
    num_blocks: int
    rounds: int
    layouts: tuple[LayoutResult, ...]
    device: DeviceFigures
    control_plane: tuple[ControlPlaneCost, ...]
    write: WritePath
    bars: tuple[Bar, ...]
    elapsed_s: float
    notes: tuple[str, ...] = ()

    def layout(self, name: str) -> LayoutResult:
        for row in self.layouts:
            if row.layout == name:
                return row
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        for row, layout in zip(doc["layouts"], self.layouts, strict=True):
            row["cpu_ns_per_byte"] = layout.cpu_ns_per_byte
            row["bytes_per_command"] = layout.bytes_per_command
        doc["write"]["cpu_ns_per_byte"] = self.write.cpu_ns_per_byte
        doc["bars"] = [dict(dataclasses.asdict(b), passed=b.passed) for b in self.bars]
        return doc


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def layers_text(layer_block_bytes: tuple[int, ...]) -> str:
    """"32 layers x 32.00 KiB", or each run of alike layers ("2 x 73.00 KiB + ...")."""
    runs = [(b, len(list(grp))) for b, grp in itertools.groupby(layer_block_bytes)]
    if len(runs) == 1:
        return f"{runs[0][1]} layers x {size_text(runs[0][0])}"
    return " + ".join(f"{n} x {size_text(b)}" for b, n in runs) + " layers"


def format_table(report: BenchReport) -> str:
    """The human-readable report (a fixed-width table plus the side figures)."""
    lines = [
        f"flatcake bench: {report.model}, {report.context_tokens} tokens in "
        f"{report.num_turns} turns ({report.num_blocks} blocks x "
        f"{layers_text(report.layer_block_bytes)}), dir {report.directory}, "
        f"{report.rounds} rounds (median)",
        f"command: {report.command}",
        "",
        f"{'layout':<16} {'gbps':>7} {'ratio':>6} {'read_commands':>13} {'bytes_read':>12} "
        f"{'bytes_useful':>12} {'restore_s':>9} {'staging':>10} {'cpu_ns/B':>8} "
        f"{'verified':>8} {'avg_cmd':>10}",
    ]
    for r in report.layouts:
        lines.append(
            f"{r.layout:<16} {r.gbps:>7.3f} {r.ratio_to_device:>6.2f} {r.read_commands:>13} "
            f"{size_text(r.bytes_read):>12} {size_text(r.bytes_useful):>12} {r.restore_s:>9.3f} "
            f"{size_text(r.staging_bytes):>10} {r.cpu_ns_per_byte:>8.2f} "
            f"{'yes' if r.verified else 'NO':>8} {size_text(r.bytes_per_command):>10}"
        )
    d = report.device
    lines += [
        "",
        f"device: seq read {d.seq_read_gbps:.3f} GB/s, seq write {d.seq_write_gbps:.3f} GB/s "
        f"({size_text(d.chunk_bytes)} x {d.in_flight} in flight); random "
        f"{size_text(d.rand_op_bytes)} reads {d.rand_read_gbps:.3f} GB/s "
        f"({d.rand_read_iops:.0f} IOPS)",
    ]
    if d.fio:
        lines.append("fio:    " + ", ".join(
            f"{name} {fig['gbps']:.3f} GB/s ({fig['iops']:.0f} IOPS)"
            for name, fig in d.fio.items()))
    else:
        lines.append("fio:    not run")
    w = report.write
    lines.append(
        f"write:  flatcake {w.write_gbps:.3f} GB/s ({size_text(w.bytes_written)} in "
        f"{w.write_s:.2f} s)"
        f" = {w.ratio_to_device:.2f} x device sequential write, "
        f"{w.cpu_ns_per_byte:.2f} CPU ns/B")
    for c in report.control_plane:
        lines.append(
            f"control plane: {c.context_tokens} tokens ({c.num_blocks} blocks, {c.num_turns} "
            f"turns): lookup_and_plan {c.lookup_and_plan_ms:.2f} ms = "
            f"{100 * c.fraction_of_restore:.2f}% of its restore "
            f"({c.restore_s:.2f} s{', estimated' if c.estimated else ''})")
    lines += footer(report.bars, report.notes, report.elapsed_s)
    return "\n".join(lines)


def footer(bars: Sequence[Bar], notes: Sequence[str], elapsed_s: float) -> list[str]:
    """A text report's last lines: each bar's verdict, the notes, the time taken."""
    lines = [""]
    for b in bars:
        lines.append(f"bar {'PASS' if b.passed else 'MISS'}: {b.name}: {b.value:.3f} {b.op} "
                     f"{b.threshold:g}")
    lines += [f"note: {n}" for n in notes]
    lines.append(f"elapsed {elapsed_s:.1f} s")
    return lines


def dump_json(report: BenchReport) -> str:
    return json.dumps(report.to_json(), indent=2, sort_keys=False)
