"""Typed configuration: one frozen dataclass per stage, composed into ``FlatCakeConfig``.

Sources are merged in one place, later ones winning:

1. the defaults below (each field documented by the string under it; the docs site's
   configuration page is generated from them, ``flatcake.config_reference``);
2. a TOML file (``[placement]``, ``[reclaim]``, ``[store]``, ``[planner]``,
   ``[scheduler]``, ``[engine]``);
3. environment variables ``FLATCAKE_<SECTION>__<FIELD>`` (e.g. ``FLATCAKE_STORE__NODE_ID=3``);
4. explicit overrides ``"section.field=value"`` (the CLI's ``--set``), or an engine's
   extra config (``load_extra_config``: vLLM's ``kv_connector_extra_config``, SGLang's
   ``--hicache-storage-backend-extra-config``).

Every value goes through ``_apply`` (a string is read as the field's type) and every
field is validated in ``__post_init__``: a bad key or value raises one ``ValueError``
naming the key and the value, an unknown key names the closest known one.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
TIB = 1024 * GIB


def _check(cond: bool, name: str, value: object, why: str) -> None:
    if not cond:
        raise ValueError(f"invalid config {name}={value!r}: {why}")


_TYPES: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "str": (str,),
                                       "bool": (bool,)}


def _check_types(obj: object, section: str) -> None:
    """Every field holds its declared type (``bool`` is not an ``int``, ``1.5`` is not
    one either, a float is finite: ``inf`` would be a timeout that never fires, ``nan``
    fails every bound with a message that does not say why), so a wrong TOML or Python
    value fails here naming the field instead of deep inside the store."""
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        want = _TYPES.get(str(f.type))
        if want is None:
            continue
        value = getattr(obj, f.name)
        ok = isinstance(value, want) and (bool in want or not isinstance(value, bool))
        _check(ok, f"{section}.{f.name}", value, f"must be a {f.type}")
        _check(not isinstance(value, float) or math.isfinite(value), f"{section}.{f.name}",
               value, "must be a finite number")


WINDOW_ROWS = ("branches", "turn-ends", "every-block")
"""``store.window_rows``: where a turn keeps sliding-window rows."""


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    """Write-time placement thresholds (FC-GVA); see ``control.placement`` for the rule order.

    Defaults come from the shared traces: chat replies are short (Azure conv mean output
    211 tokens, Kimi chat 343), agent turns carry long histories (Claude Code mean input
    121K tokens, median session context 148K), so 32K tokens of context already marks an
    agent session whose KV (4 GiB on Llama-3.1-8B) no host arena holds for long.

    Defaults measured with the replay (README, "Placement defaults"): copies on at 0.9,
    and the short-reply rule off (0). With copies, a chat turn homed on SSD is served
    from memory while memory has room, like one homed in memory, and stays a hit when
    memory fills; a turn homed in memory is then dropped (reclaim never writes back),
    which cost 0.4 points of hit rate on the Mooncake chat trace against tiered LRU
    demotion. ``flatcake tune`` turns the rule back on where it pays.
    """

    agent_context_threshold_tokens: int = 32 * 1024
    """A turn whose context reaches this many tokens is an agent turn: homed on the SSD."""
    long_reply_threshold_tokens: int = 2048
    """A previous reply this long or longer marks a session whose next turn goes to SSD."""
    short_reply_threshold_tokens: int = 0
    """A previous reply this short keeps the next turn in memory; 0 turns the rule off."""
    shared_refcount_threshold: int = 0
    """A turn whose first new block this many live requests hold or more (this one
    included: a system prompt, a retried or duplicated prompt) is homed in memory; 2 (any
    sharing) is the paper's rule, 0 turns it off. Off by default for the reason the
    short-reply rule is: with copies a shared turn homed on SSD is served from its copy
    while memory has room and stays a hit when memory fills, whereas reclaim drops a turn
    homed in memory (Mooncake chat trace at 8 req/s: 56 such turns dropped, 0.17 points
    of hit rate below tiered-direct's)."""
    memory_copy_watermark: float = 0.9
    """Spare host memory: an SSD-homed turn also gets a memory copy (clean: never written
    back, dropped before any memory-homed segment under pressure; its home and address do
    not change) while host memory use, copy included, stays at or under this fraction of
    the arena; restores read the copy. 0 turns copies off."""
    copy_on_restore: bool = False
    """A restore that reads a whole SSD segment (one with no copy) also gets a memory copy
    of it under the same watermark, written from the verified restored blocks, so the
    session's next turn reads host memory. Each layer is copied as it lands, overlapping
    the next layer's reads, and the request waits for the last layer's copy (the replay
    charges the same). Off by default (README, "Placement defaults")."""
    branch_tail_tokens: int = 32 * 1024
    """A request without a ``session_id`` that shares only part of a stored session (a
    retry, a sub-agent, another question) is a branch: its new blocks append to the
    session owning the block it branches from, up to this many tokens of branch tails per
    session, then to an heir session under the same cap (``control.signals``)."""
    not_yet: bool = False
    """A first turn below the agent threshold that no live request shares is homed in host
    memory and written to the SSD only when its session continues (NOT_YET), so a chat that
    ends after one turn costs no SSD wear; false sends it to the SSD at once."""
    not_yet_write_back: bool = False
    """With ``not_yet``: memory reclaim takes the not-yet homes before anything else in
    host memory (memory copies of SSD turns included), oldest session first, and writes
    each one whose session may still continue to the SSD from host memory (its home freed
    once durable) instead of dropping it. The replay only: the store, the vLLM connector
    and the node service do not write from host memory to the SSD, and refuse it."""
    not_yet_idle_s: float = 0.0
    """With ``not_yet_write_back``: a not-yet home whose session has been idle longer
    than this many seconds is dropped unwritten at reclaim (its chat taken as over); 0
    writes every one."""

    def __post_init__(self) -> None:
        _check_types(self, "placement")
        for name in (
            "agent_context_threshold_tokens",
            "branch_tail_tokens",
            "long_reply_threshold_tokens",
            "short_reply_threshold_tokens",
            "shared_refcount_threshold",
        ):
            v = getattr(self, name)
            _check(isinstance(v, int) and v >= 0, f"placement.{name}", v, "must be an int >= 0")
        _check(self.shared_refcount_threshold != 1, "placement.shared_refcount_threshold",
               self.shared_refcount_threshold,
               "must be 0 (off) or at least 2 (every turn is held by its own request)")
        i = self.not_yet_idle_s
        _check(isinstance(i, (int, float)) and not isinstance(i, bool) and i >= 0,
               "placement.not_yet_idle_s", i, "must be a number >= 0")
        w = self.memory_copy_watermark
        _check(isinstance(w, (int, float)) and not isinstance(w, bool) and 0.0 <= w <= 1.0,
               "placement.memory_copy_watermark", w, "must be a number in [0, 1]")
        _check(
            self.short_reply_threshold_tokens <= self.long_reply_threshold_tokens,
            "placement.short_reply_threshold_tokens",
            self.short_reply_threshold_tokens,
            "must not exceed long_reply_threshold_tokens",
        )


@dataclass(frozen=True, slots=True)
class ReclaimConfig:
    """Watermarks as fractions of each medium's capacity: reclaim starts when use crosses
    ``*_high`` and drops whole sessions, oldest last access first, until use is at or
    under ``*_low``."""

    ssd_high: float = 0.90
    """SSD use (fraction of ``store.ssd_capacity_bytes``) that starts a reclaim."""
    ssd_low: float = 0.80
    """SSD use a reclaim brings the store back to."""
    memory_high: float = 0.90
    """Host memory use (fraction of ``store.memory_capacity_bytes``) that starts a reclaim."""
    memory_low: float = 0.80
    """Host memory use a reclaim brings the store back to."""

    def __post_init__(self) -> None:
        _check_types(self, "reclaim")
        for medium in ("ssd", "memory"):
            hi, lo = getattr(self, f"{medium}_high"), getattr(self, f"{medium}_low")
            _check(0.0 < hi <= 1.0, f"reclaim.{medium}_high", hi, "must be in (0, 1]")
            _check(0.0 <= lo < hi, f"reclaim.{medium}_low", lo, f"must be in [0, {medium}_high)")


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    """Read planning (FC-CIO)."""

    gap_limit_bytes: int = 64 * KIB
    """Read through holes smaller than this between two wanted ranges of one file (the
    paper uses 64 KiB)."""
    max_read_bytes: int = 64 * MIB
    """Split merged reads larger than this, so several commands stay in flight."""

    def __post_init__(self) -> None:
        _check_types(self, "planner")
        _check(self.gap_limit_bytes >= 0, "planner.gap_limit_bytes", self.gap_limit_bytes,
               "must be >= 0")
        _check(self.max_read_bytes >= 4 * KIB and self.max_read_bytes % (4 * KIB) == 0,
               "planner.max_read_bytes", self.max_read_bytes,
               "must be a positive multiple of 4096")


THREAD_CPUS_WORDS = ("auto", "inherit")
"""``store.thread_cpus`` values besides a CPU list (``cio.affinity``)."""


def parse_cpu_list(text: str) -> frozenset[int]:
    """``"0,2-3"`` -> ``{0, 2, 3}``; ``ValueError`` naming the part that is wrong."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi if dash else lo)
        except ValueError:
            raise ValueError(f"{part.strip()!r} is not a CPU number or range") from None
        if first < 0 or last < first:
            raise ValueError(f"{part.strip()!r} is not a CPU range (0 <= first <= last)")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """FC-MAS restore scheduling."""

    max_restores_in_flight: int = 2
    """SSD restores holding a staging window (two layers per stream) at once; further
    restores wait for a slot, never cancel."""
    single_queue: bool = False
    """The one-FIFO-queue ablation of FC-MAS."""

    def __post_init__(self) -> None:
        _check_types(self, "scheduler")
        _check(self.max_restores_in_flight >= 1, "scheduler.max_restores_in_flight",
               self.max_restores_in_flight, "must be >= 1")


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Where and how much the store keeps on this node, and how it meets the others.

    Beyond one node (``flatcake.cluster``; needs the ``redis`` client and NIXL): with
    ``cluster_url`` set the store joins the cluster as ``node_id``, publishes its durable
    segments there, serves its arena and session files to peers, and restores blocks
    other nodes hold after its local prefix.

    One store per machine (``flatcake serve``, ``flatcake.service``): with ``node`` set in
    an engine's configuration, the engine attaches to that service instead of opening
    ``root`` itself: the service's budgets, root and books serve every engine attached.
    """

    root: str = "./flatcake-data"
    """The store's folder (``FlatCakeStore.open``'s ``root`` argument wins over it)."""
    node_id: int = 0
    """This node's id in a cluster, unique per node: bits 59..48 of every address."""
    memory_capacity_bytes: int = 4 * GIB
    """Host arena budget, a hard limit enforced at allocation (pages touched lazily)."""
    ssd_capacity_bytes: int = 64 * GIB
    """SSD budget, a hard limit enforced at allocation (headers and segments)."""
    session_file_bytes: int = 64 * GIB
    """The virtual span reserved for each session file in the node's SSD address space
    (files grow inside it; a session that outgrows it continues in a fresh span)."""
    io_mode: str = "auto"
    """``direct`` requires O_DIRECT and fails with a clear error where the filesystem
    refuses it; ``buffered`` uses the page cache and says so in the log; ``auto`` tries
    direct and falls back to buffered with a warning."""
    read_threads: int = 4
    """Threads of the store's one reader (``preadv`` calls running at once, over all
    restores)."""
    reads_in_flight: int = 8
    """Read commands one restore keeps with the reader at once; the rest of its reads wait
    in order (``cio.readers.ReadQueue``)."""
    thread_cpus: str = "auto"
    """CPUs of the store's I/O threads (``cio.affinity``): ``auto`` moves them off an
    engine's bound compute cores, ``inherit`` leaves them there, or a list such as
    ``1,3-5``."""
    cluster_url: str = ""
    """The cluster index's Redis (``redis://host:port/db``); empty: this node alone."""
    cluster_name: str = "flatcake"
    """Key prefix in Redis: deployments sharing one Redis stay apart."""
    remote_timeout_s: float = 5.0
    """Bound of one remote read: a dead or slow owner is a miss after it."""
    remote_window_bytes: int = 64 * MIB
    """One receive window of remote reads (at least one layer of the largest segment)."""
    remote_windows: int = 3
    """Receive windows, each in its own client agent: that many remote reads run at once
    (one per restore in flight, ``scheduler.max_restores_in_flight``'s 2, plus the
    all-memory load thread). A read that timed out retires its window (a late write may
    still land there); at most this many are renewed, so the windows never take more than
    ``2 * remote_windows * remote_window_bytes``."""
    node: str = ""
    """The node service's socket (``unix:/run/flatcake/node.sock`` or a plain path); empty:
    the store is embedded in this process."""
    node_timeout_s: float = 2.0
    """Bound of one call to the node service: past it a miss, one warning, and the engine
    re-attaches later."""
    node_lease_s: float = 30.0
    """(service) How long the service keeps an engine that stopped calling: then its pins
    are released and its unfinished writes rolled back."""
    node_arena_dir: str = "/dev/shm"
    """(service) Where the service keeps its shared arena file (a tmpfs or hugetlbfs
    mount; the file is readable by the service's user only)."""
    node_socket_group: str = ""
    """A group name or gid whose members may attach too: the service makes its socket 0660
    and its directory 0750, both that group's, and a client with the same key trusts a
    service socket of that group; the service's files stay its user's (see the node
    service page: what a member can and cannot do). Empty: only the service's user and
    root attach."""
    node_max_connections_per_uid: int = 512
    """(service) Once one user holds more connections to the service, its longest-idle one
    is closed, so a flood of connections cannot starve a real client; 0: no cap."""
    release_old_windows: bool = True
    """Models with sliding-window layers: once a newer turn of a session is durable, the
    window rows of its older turns are superseded; they are punched out of the session file
    when the SSD would cross its high watermark, before any whole session is dropped.
    False keeps every turn's window until the session is reclaimed."""
    release_windows_at_once: bool = False
    """Release superseded window rows as soon as the newer turn is durable (a session then
    holds about one window per sliding layer; a hit ending at an older turn is cut back and
    recomputed)."""
    window_rows: str = "branches"
    """Where a turn keeps window rows, so where a later hit may end: ``turn-ends`` at each
    turn's end; ``branches`` (the default) also where a prompt branches off a stored prefix
    that holds no window there (the turn then keeps the window before the branch too);
    ``every-block`` at every block (every hit served, the most SSD bytes: on
    DeepSeek-V4-Flash 12.2 MB of compressor state per 128-token block)."""
    window_row_stride_tokens: int = 1024
    """With ``turn-ends`` or ``branches``, a turn also keeps the window at every multiple
    of this many prompt tokens (rounded to whole blocks; 0 = off; a turn these rows would
    push past one session file's span keeps its end's only), so a hit ending inside
    a turn (a prompt diverging where none diverged before) is cut back by at most that
    many tokens; one window of rows per stride (``block tokens / stride`` of
    ``every-block``'s window bytes). A turn keeping rows inside it keeps them when a newer
    turn is durable (other prompts end their hits there)."""

    def __post_init__(self) -> None:
        _check_types(self, "store")
        _check(self.window_row_stride_tokens >= 0, "store.window_row_stride_tokens",
               self.window_row_stride_tokens, "must be >= 0 (0 = no stride)")
        _check(self.window_rows in WINDOW_ROWS, "store.window_rows", self.window_rows,
               f"must be one of {', '.join(WINDOW_ROWS)}")
        _check(self.node_timeout_s > 0, "store.node_timeout_s", self.node_timeout_s,
               "must be > 0")
        _check(self.node_lease_s >= 1, "store.node_lease_s", self.node_lease_s,
               "must be >= 1")
        _check(self.node_max_connections_per_uid >= 0,
               "store.node_max_connections_per_uid", self.node_max_connections_per_uid,
               "must be >= 0 (0: no cap)")
        _check(not self.cluster_url or self.cluster_url.startswith(
            ("redis://", "rediss://", "unix://")), "store.cluster_url", self.cluster_url,
            "must be a Redis URL (redis://host:port/db, rediss://..., unix://...) or empty")
        _check(bool(self.cluster_name) and ":" not in self.cluster_name,
               "store.cluster_name", self.cluster_name, "must be non-empty without ':'")
        _check(self.remote_timeout_s > 0, "store.remote_timeout_s", self.remote_timeout_s,
               "must be > 0")
        _check(self.remote_window_bytes >= 4 * KIB, "store.remote_window_bytes",
               self.remote_window_bytes, "must be >= 4096")
        _check(1 <= self.remote_windows <= 64, "store.remote_windows", self.remote_windows,
               "must be in [1, 64]")
        _check(0 <= self.node_id < 4096, "store.node_id", self.node_id, "must be in [0, 4096)")
        _check(self.memory_capacity_bytes >= 0, "store.memory_capacity_bytes",
               self.memory_capacity_bytes, "must be >= 0")
        _check(self.ssd_capacity_bytes >= 0, "store.ssd_capacity_bytes",
               self.ssd_capacity_bytes, "must be >= 0")
        _check(self.session_file_bytes >= 4 * KIB and self.session_file_bytes % (4 * KIB) == 0,
               "store.session_file_bytes", self.session_file_bytes,
               "must be a positive multiple of 4096")
        _check(self.io_mode in ("auto", "direct", "buffered"), "store.io_mode", self.io_mode,
               "must be one of auto, direct, buffered")
        _check(self.read_threads >= 1, "store.read_threads", self.read_threads, "must be >= 1")
        _check(self.reads_in_flight >= 1, "store.reads_in_flight", self.reads_in_flight,
               "must be >= 1")
        if self.thread_cpus not in THREAD_CPUS_WORDS:
            try:
                parse_cpu_list(self.thread_cpus)
            except ValueError as exc:
                raise ValueError(f"invalid config store.thread_cpus={self.thread_cpus!r}: "
                                 f"must be auto, inherit or a CPU list like 0,2-3 ({exc})"
                                 ) from None


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What an engine host (the vLLM connector, the SGLang backend, an engine the node
    service hosts) does around the store. Every host reads these keys from this one
    section; in an engine's extra config they may also be given bare (``"tenant_salt"``
    for ``"engine.tenant_salt"``), the names they had before they were a section."""

    tenant_salt: str = ""
    """Mixed into every block key's namespace (with the model name), so two deployments
    sharing a store root never read each other's blocks."""
    model_name: str = ""
    """(SGLang) The model name in the key namespace where SGLang passes none."""
    infer_sessions: bool = True
    """A request that carries no ``session_id`` is attributed to the session whose stored
    history it extends (``control.signals.SessionTracker``); false makes each such request
    a session of its own."""
    max_sessions: int = 100_000
    """Sessions a host's session tracker remembers; the least recently used one past it is
    forgotten (its next turn starts a new session)."""
    min_hit_blocks: int = 1
    """Hits shorter than this many blocks are recomputed instead of loaded (a restore has
    a fixed cost)."""
    max_pending_stores: int = 64
    """Turn writes a worker queues behind the one it is writing; a store beyond them is
    dropped (a later miss), never waited for."""
    shutdown_drain_s: float = 60.0
    """How long a stopping worker waits for queued writes; what is left is dropped, never
    published. A worker that its engine kills after a grace period drains for at most half
    of it."""
    ssd_loads_in_step: bool = True
    """On a CPU engine, an SSD hit loads in the step that schedules its request, the
    forward pass waiting for each layer; false keeps it async: the request waits in vLLM's
    remote-KV state and other requests' steps never wait for a disk."""
    in_step_load_timeout_s: float = 5.0
    """How long a step waits for a load in the step (an in-step SSD hit, or an all-memory
    one), from the step's start. Past it the load is given up: its blocks are load errors
    that the engine recomputes, and the restore is fenced off from the KV slots."""
    async_load_timeout_s: float = 60.0
    """How long an async load (an SSD hit on a GPU engine, a hit on other nodes) may take
    from its start, queueing for a staging window included; past it the load is given up
    as an in-step one is."""
    cluster_lookup_timeout_s: float = 2.0
    """(cluster) Bound of one Redis call of the scheduler half's index lookups (at most
    ``store.remote_timeout_s``)."""
    cluster_lookup_retry_s: float = 5.0
    """(cluster) After a failed index lookup, lookups answer local-only this long without
    asking Redis."""
    cluster_lookup_fresh_s: float = 1.0
    """(cluster) A request's remote runs are looked up again after this long (the engine
    asks every step a request waits)."""
    cluster_lookup_first_keys: int = 8
    """(cluster) Keys of a request's first index lookup; each next one asks four times
    more while every key asked was found, so a miss costs one small lookup."""
    node_reattach_s: float = 1.0
    """(attached) The first wait before re-attaching to a node service that stopped
    answering; it doubles at each failed attempt."""
    node_reattach_max_s: float = 30.0
    """(attached) The longest wait between two re-attach attempts."""

    def __post_init__(self) -> None:
        _check_types(self, "engine")
        for name in ("min_hit_blocks", "max_pending_stores", "max_sessions",
                     "cluster_lookup_first_keys"):
            _check(getattr(self, name) >= 1, f"engine.{name}", getattr(self, name),
                   "must be >= 1")
        _check(self.shutdown_drain_s >= 0, "engine.shutdown_drain_s", self.shutdown_drain_s,
               "must be >= 0")
        for name in ("in_step_load_timeout_s", "async_load_timeout_s",
                     "cluster_lookup_timeout_s", "cluster_lookup_retry_s",
                     "cluster_lookup_fresh_s", "node_reattach_s"):
            _check(getattr(self, name) > 0, f"engine.{name}", getattr(self, name),
                   "must be > 0")
        _check(self.node_reattach_max_s >= self.node_reattach_s, "engine.node_reattach_max_s",
               self.node_reattach_max_s, "must be >= engine.node_reattach_s")

    def drain_within(self, grace_s: float | None) -> float:
        """How long a stopping worker drains its writes when its engine gives the
        process ``grace_s`` seconds to exit before it signals it (``None``: no limit):
        ``shutdown_drain_s``, but at most half of the grace. The process must still exit
        after the drain (vLLM's worker collects its whole heap, about 2 CPU s on a
        CPU machine), and a drain cut short by a kill would leave a write half done
        for the next start to discard instead of dropping it cleanly."""
        if grace_s is None:
            return self.shutdown_drain_s
        return min(self.shutdown_drain_s, max(grace_s, 0.0) / 2)


@dataclass(frozen=True, slots=True)
class FlatCakeConfig:
    """The whole configuration, one section per stage."""

    model: str = "llama-3.1-8b"
    """The geometry preset (``geometry.PRESETS``) of the store API and the tools; an engine
    host takes its geometry from the engine's KV cache instead."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    reclaim: ReclaimConfig = field(default_factory=ReclaimConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)


SECTIONS: dict[str, type] = {
    "placement": PlacementConfig,
    "reclaim": ReclaimConfig,
    "planner": PlannerConfig,
    "scheduler": SchedulerConfig,
    "store": StoreConfig,
    "engine": EngineConfig,
}
"""Each section of ``FlatCakeConfig`` and its dataclass, in the order the docs list them."""


def keys() -> list[str]:
    """Every key a user may set, as ``section.field`` (``model`` alone)."""
    return ["model", *(f"{section}.{f.name}" for section, cls in SECTIONS.items()
                       for f in dataclasses.fields(cls))]


def _unknown(key: str, where: str = "config") -> ValueError:
    close = difflib.get_close_matches(key, keys(), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ValueError(f"unknown {where} key {key!r}{hint} (every key: "
                      "docs/usage/configuration.md)")


def _coerce(section: str, name: str, raw: Any, target: Any) -> Any:
    """Convert a string (env, ``--set``, or a string in a TOML or JSON file) to the
    field's declared type."""
    if isinstance(raw, str) and target not in (str, "str"):
        text = raw.strip()
        if target in (bool, "bool"):
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"invalid config {section}.{name}={raw!r}: expected a boolean")
        try:
            if target in (int, "int"):
                return int(text.replace("_", ""))
            if target in (float, "float"):
                return float(text)
        except ValueError:
            raise ValueError(
                f"invalid config {section}.{name}={raw!r}: expected {target}"
            ) from None
    return raw


def apply_setting(cfg: FlatCakeConfig, section: str, name: str, raw: Any) -> FlatCakeConfig:
    """``cfg`` with ``section.name`` set from ``raw`` (a TOML, env or ``--set`` value),
    checked as ``load_config`` checks it: the one place a value enters a config."""
    if section == "" and name == "model":
        return dataclasses.replace(cfg, model=str(raw))
    cls = SECTIONS.get(section)
    fields = {f.name: f for f in dataclasses.fields(cls)} if cls is not None else {}
    if name not in fields:
        raise _unknown(f"{section}.{name}" if section else name)
    value = _coerce(section, name, raw, fields[name].type)
    current = getattr(cfg, section)
    return dataclasses.replace(cfg, **{section: dataclasses.replace(current, **{name: value})})


Setting = tuple[str, str, Any]  # (section, field, value); section "" for ``model``


def load_config(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Sequence[str] = (),
) -> FlatCakeConfig:
    """Build a config from defaults, a TOML file, ``FLATCAKE_*`` env vars and overrides."""
    settings: list[Setting] = []
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"config override {item!r} must look like section.field=value")
        dotted, raw = item.split("=", 1)
        section, _, name = dotted.strip().rpartition(".")
        settings.append((section, name, raw))
    return _merge(path, env, settings)


def _merge(path: str | Path | None, env: Mapping[str, str] | None,
           settings: Iterable[Setting], where: str = "") -> FlatCakeConfig:
    """Defaults, then the TOML file at ``path``, then the environment, then ``settings``
    (errors in those prefixed with ``where``)."""
    cfg = FlatCakeConfig()
    if path is not None:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
        for key, value in data.items():
            if isinstance(value, dict):
                for name, raw in value.items():
                    cfg = apply_setting(cfg, key, name, raw)
            else:
                cfg = apply_setting(cfg, "", key, value)
    environ = os.environ if env is None else env
    for key, raw in sorted(environ.items()):
        if not key.startswith("FLATCAKE_"):
            continue
        rest = key[len("FLATCAKE_"):].lower()
        if rest == "model":
            cfg = apply_setting(cfg, "", "model", raw)
        elif "__" in rest:
            section, name = rest.split("__", 1)
            cfg = apply_setting(cfg, section, name, raw)
    for section, name, raw in settings:
        try:
            cfg = apply_setting(cfg, section, name, raw)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}" if where else str(exc)) from None
    return cfg


_ENGINE_FIELDS = tuple(f.name for f in dataclasses.fields(EngineConfig))


def load_extra_config(where: str, extra: Mapping[str, Any] | None,
                      env: Mapping[str, str] | None = None, *,
                      ignore: Sequence[str] = ()) -> FlatCakeConfig:
    """The configuration of an engine host from its extra config (``where`` names it in
    errors: ``kv_connector_extra_config``), merged as ``load_config`` merges: defaults,
    then ``config_file`` (a TOML file), then ``FLATCAKE_*`` variables (``env``, by default
    ``os.environ``), then the extra config itself::

        {"store": {"root": "/nvme/flatcake"},          # a section, nested
         "placement.not_yet": true,                    # or dotted
         "tenant_salt": "team-a",                      # an engine key, bare
         "config_file": "/etc/flatcake.toml"}

    The geometry comes from the engine, so ``model`` is refused; keys in ``ignore`` (the
    engine's own) are skipped; any other unknown key is refused by name."""
    extra = {} if extra is None else extra
    if not isinstance(extra, Mapping):
        raise ValueError(f"{where} must be a JSON object, got {type(extra).__name__}")
    config_file = None
    settings: list[Setting] = []
    for key, value in extra.items():
        if not isinstance(key, str):
            raise ValueError(f"{where} keys must be strings, got {key!r}")
        section, dot, name = key.partition(".")
        if key in ignore:
            continue
        if key == "config_file":
            if not isinstance(value, str) or not value:
                raise ValueError(f"{where}.config_file must be a path, got {value!r}")
            config_file = value
        elif key == "model":
            raise ValueError(f"{where}.model is not accepted: the KV geometry comes from "
                             "the engine")
        elif key in _ENGINE_FIELDS:
            settings.append(("engine", key, _scalar(where, key, value)))
        elif key in SECTIONS:
            if not isinstance(value, Mapping):
                raise ValueError(f"{where}.{key} must be an object of {key} keys, got "
                                 f"{value!r}")
            settings += [(key, str(n), _scalar(where, f"{key}.{n}", v))
                         for n, v in value.items()]
        elif dot and section in SECTIONS:
            settings.append((section, name, _scalar(where, key, value)))
        else:
            raise _unknown(key, where)
    return _merge(config_file, env, settings, where)


def _scalar(where: str, key: str, value: Any) -> Any:
    if isinstance(value, Mapping | list | tuple) or value is None:
        raise ValueError(f"{where}.{key} must be a single value, got {value!r}")
    return value
