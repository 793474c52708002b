"""``flatcake bench``: real restores on the disk at hand, FlatCake's layout against the
device ceiling and against the peers' layouts (eviction-order ``scattered`` and
``per-chunk-files``), all read with the same O_DIRECT reader."""

from flatcake.bench.report import BenchReport, LayoutResult, dump_json, format_table
from flatcake.bench.runner import LAYOUTS, BenchOptions, run_bench

__all__ = [
    "LAYOUTS",
    "BenchOptions",
    "BenchReport",
    "LayoutResult",
    "dump_json",
    "format_table",
    "run_bench",
]
