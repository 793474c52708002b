"""FlatCake's numbers in vLLM: connector stats per interval and ``vllm:flatcake_*`` series.

The scheduler half's counters (``connectors.scheduler_side.COUNTER_KEYS``) and the
workers' byte counters travel as ``FlatCakeStats`` with the engine's stats; vLLM logs
them and hands them to ``FlatCakePromMetrics`` for its ``/metrics`` endpoint. Every
series exists from start-up (zero until something happens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

from flatcake.control.placement import PlacementRule

if TYPE_CHECKING:
    from vllm.config import VllmConfig

GAUGE_KEYS = ("restores_in_flight", "restores_waiting", "ssd_unread_bytes")
MEDIA = ("memory", "ssd", "remote")
IO_KINDS = ("read_ssd", "copied_memory", "written_ssd", "written_memory", "read_remote")


@dataclass
class FlatCakeStats(KVConnectorStats):
    """Counters (summed over workers and intervals) and gauges (latest) of one interval;
    ``data`` maps ``connectors.scheduler_side.COUNTER_KEYS``, worker byte counters,
    ``placements.<rule>`` and ``GAUGE_KEYS`` to numbers."""

    data: dict[str, Any] = field(default_factory=dict)

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for key, value in other.data.items():
            if key in GAUGE_KEYS:
                self.data[key] = value
            else:
                self.data[key] = self.data.get(key, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        out = dict(self.data)
        prompt = out.get("prompt_tokens", 0)
        if prompt:
            loaded = sum(out.get(f"loaded_tokens_{m}", 0) for m in MEDIA)
            out["delivered_hit_rate"] = round(loaded / prompt, 4)
        return out

    def is_empty(self) -> bool:
        return not any(v for k, v in self.data.items() if k not in GAUGE_KEYS)


class FlatCakePromMetrics(KVConnectorPromMetrics):
    """``vllm:flatcake_*`` series on vLLM's ``/metrics``: the delivered hit rate's two
    counters (and the rate itself), tokens loaded per medium, restores in flight and
    waiting, staging-slot waits, placements by rule, load errors, stores, SSD wear
    (bytes written, read back, dropped unread; unread now)."""

    _COUNTERS: ClassVar[dict[str, tuple[str, str]]] = {
        "prompt_tokens": ("vllm:flatcake_prompt_tokens",
                          "Prompt tokens looked up in FlatCake (hit-rate denominator)."),
        "hit_tokens": ("vllm:flatcake_hit_tokens",
                       "Prompt tokens FlatCake held when their request was admitted."),
        "load_error_blocks": ("vllm:flatcake_load_error_blocks",
                              "Hit blocks not delivered (corrupt or unreadable): recomputed."),
        "damaged_segments": ("vllm:flatcake_damaged_segments",
                             "Stored segments that failed their crc32 check."),
        "restores_started": ("vllm:flatcake_restores_started",
                             "SSD restores started by the FC-MAS scheduler."),
        "staging_slot_waits": ("vllm:flatcake_staging_slot_waits",
                               "SSD restores that waited for a staging window."),
        "loads_staged": ("vllm:flatcake_loads_staged",
                         "SSD restores read through the staging window and one copy "
                         "(zero-copy refused, e.g. blocks not a multiple of 4 KiB)."),
        "loads_late": ("vllm:flatcake_loads_late",
                       "Loads given up at their deadline (in_step_load_timeout_s, "
                       "async_load_timeout_s): recomputed."),
        "loads_backed_off": ("vllm:flatcake_loads_backed_off",
                             "SSD hits recomputed instead of loaded in the step while a "
                             "load given up at its deadline still reads the disk."),
        "lookup_waits": ("vllm:flatcake_lookup_waits",
                         "Lookups deferred behind a store of the same prefix."),
        "cluster_lookup_failures": ("vllm:flatcake_cluster_lookup_failures",
                                    "Cluster index lookups that failed (local-only)."),
        "stores_ok": ("vllm:flatcake_stores_ok", "Turn segments written and published."),
        "stores_failed": ("vllm:flatcake_stores_failed", "Turn segments whose write failed."),
        "stores_rejected": ("vllm:flatcake_stores_rejected",
                            "Turns no medium could take (capacity)."),
        "write_backs": ("vllm:flatcake_write_backs",
                        "Not-yet homes memory reclaim wrote to the SSD from host memory "
                        "rather than drop (placement.not_yet_write_back): stores too."),
        "ssd_written_bytes": ("vllm:flatcake_ssd_written_bytes",
                              "SSD bytes written (published segments), the node's."),
        "ssd_read_bytes": ("vllm:flatcake_ssd_read_back_bytes",
                           "SSD bytes read back by restores, the node's."),
        "ssd_dropped_unread_bytes": ("vllm:flatcake_ssd_dropped_unread_bytes",
                                     "SSD bytes written and dropped by reclaim before any "
                                     "restore read them (wear for nothing), the node's."),
    }

    def __init__(self, vllm_config: VllmConfig, metric_types: Any, labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters = {key: self._counter_cls(name=name, documentation=doc,
                                                 labelnames=labelnames)
                          for key, (name, doc) in self._COUNTERS.items()}
        self._loaded = self._counter_cls(
            name="vllm:flatcake_loaded_tokens",
            documentation="Prompt tokens delivered to the engine's KV cache before prefill, "
                          "per medium they came from.",
            labelnames=[*labelnames, "medium"])
        self._stored = self._counter_cls(
            name="vllm:flatcake_stored_blocks",
            documentation="Blocks written by FlatCake, per medium.",
            labelnames=[*labelnames, "medium"])
        self._placements = self._counter_cls(
            name="vllm:flatcake_placements",
            documentation="Turn placements, by the rule that decided them.",
            labelnames=[*labelnames, "rule"])
        self._bytes = self._counter_cls(
            name="vllm:flatcake_io_bytes",
            documentation="Bytes moved by FlatCake workers (read_ssd, copied_memory, "
                          "written_ssd, written_memory, read_remote).",
            labelnames=[*labelnames, "kind"])
        self._in_flight = self._gauge_cls(
            name="vllm:flatcake_restores_in_flight",
            documentation="SSD restores holding a staging window now.",
            labelnames=labelnames, multiprocess_mode="mostrecent")
        self._waiting = self._gauge_cls(
            name="vllm:flatcake_restores_waiting",
            documentation="SSD restores waiting in the FC-MAS queue now.",
            labelnames=labelnames, multiprocess_mode="mostrecent")
        self._unread = self._gauge_cls(
            name="vllm:flatcake_ssd_unread_bytes",
            documentation="SSD bytes of live segments no restore has read yet, the node's.",
            labelnames=labelnames, multiprocess_mode="mostrecent")
        self._hit_rate = self._gauge_cls(
            name="vllm:flatcake_delivered_hit_rate",
            documentation="Prompt tokens delivered to the engine's KV before prefill over "
                          "prompt tokens looked up, since start.",
            labelnames=labelnames, multiprocess_mode="mostrecent")
        self._totals: dict[int, list[float]] = {}
        # Every series and label value exists from the start (zero until it happens),
        # so a dashboard or an alert never misses one.
        for labels in per_engine_labelvalues.values():
            for counter in self._counters.values():
                counter.labels(*labels)
            for medium in MEDIA:
                self._loaded.labels(*labels, medium)
                self._stored.labels(*labels, medium)
            for rule in PlacementRule:
                self._placements.labels(*labels, rule.value)
            for kind in IO_KINDS:
                self._bytes.labels(*labels, kind)
            for gauge in (self._in_flight, self._waiting, self._unread, self._hit_rate):
                gauge.labels(*labels).set(0)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        labels = self.per_engine_labelvalues[engine_idx]
        data = transfer_stats_data
        for key, counter in self._counters.items():
            if data.get(key):
                counter.labels(*labels).inc(data[key])
        for medium in MEDIA:
            if data.get(f"loaded_tokens_{medium}"):
                self._loaded.labels(*labels, medium).inc(data[f"loaded_tokens_{medium}"])
            if data.get(f"stored_blocks_{medium}"):
                self._stored.labels(*labels, medium).inc(data[f"stored_blocks_{medium}"])
        for key, value in data.items():
            if key.startswith("placements.") and value:
                self._placements.labels(*labels, key.split(".", 1)[1]).inc(value)
            elif key.startswith(("bytes_read_", "bytes_copied_", "bytes_written_")) and value:
                self._bytes.labels(*labels, key[len("bytes_"):]).inc(value)
        if "restores_in_flight" in data:
            self._in_flight.labels(*labels).set(data["restores_in_flight"])
        if "restores_waiting" in data:
            self._waiting.labels(*labels).set(data["restores_waiting"])
        if "ssd_unread_bytes" in data:
            self._unread.labels(*labels).set(data["ssd_unread_bytes"])
        total = self._totals.setdefault(engine_idx, [0.0, 0.0])
        total[0] += sum(data.get(f"loaded_tokens_{m}", 0) for m in MEDIA)
        total[1] += data.get("prompt_tokens", 0)
        if total[1]:
            self._hit_rate.labels(*labels).set(total[0] / total[1])
