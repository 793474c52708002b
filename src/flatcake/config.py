"""Typed configuration: one frozen dataclass per stage, composed into ``FlatCakeConfig``.

Sources are merged in one place, later ones winning:

1. the defaults below (each documented where it is defined);
2. a TOML file (``[placement]``, ``[reclaim]``, ``[store]``, ``[planner]``, ``[scheduler]``);
3. environment variables ``FLATCAKE_<SECTION>__<FIELD>`` (e.g. ``FLATCAKE_STORE__NODE_ID=3``);
4. explicit overrides ``"section.field=value"`` (the CLI's ``--set``).

Every field is validated in ``__post_init__``; a bad value raises ``ValueError`` naming
the field and the value.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from collections.abc import Mapping, Sequence
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

    ``memory_copy_watermark``: spare host memory. An SSD-homed turn also gets a memory
    copy (clean: never written back, dropped before any memory-homed segment under
    pressure; its home and address do not change) while host memory use, copy
    included, stays at or under this fraction of the arena; restores read the copy.
    ``0`` turns copies off.

    ``copy_on_restore``: a restore that reads a whole SSD segment (one with no copy)
    also gets a memory copy of it under the same watermark, written by the data plane
    from the verified restored blocks, so the session's next turn reads host memory (the
    way a tiered store's LRU refills host memory on a hit). Homes never change. The
    restore copies each layer as it lands, overlapping the next layer's reads (a
    device-to-host copy on a GPU), and its request waits for the last layer's copy
    (``cio.refill``; the replay charges the same). Off by default (see README,
    "Placement defaults" for the measured trade-off).

    Defaults measured with the replay (README, "Placement defaults"): copies on at 0.9,
    and the short-reply rule off (0). With copies, a chat turn homed on SSD is served
    from memory while memory has room, like one homed in memory, and stays a hit when
    memory fills; a turn homed in memory is then dropped (reclaim never writes back),
    which cost 0.4 points of hit rate on the Mooncake chat trace against tiered LRU
    demotion. ``flatcake tune`` turns the rule back on where it pays.

    ``not_yet``: a first turn below the agent threshold that no live request shares is
    homed in host memory and written to the SSD only when its session continues, so a
    chat that ends after one turn costs no SSD wear (``control.placement``, NOT_YET).
    ``False`` sends it to the SSD at once (FIRST_TURN), as before.

    ``branch_tail_tokens``: a request without a ``session_id`` that shares only part of
    a stored session (the same history with a different question, a retry, a
    sub-agent) is a *branch*; its new blocks append to the session owning the block it
    branches from, so one conversation's tails stay in one file instead of a new
    session file each. A session takes this many tokens of branch tails; past it, its
    branches go to an heir session under the same cap (``control.signals``), which
    bounds what a reclaim of one session drops and what a hot shared prompt keeps.
    """

    agent_context_threshold_tokens: int = 32 * 1024
    long_reply_threshold_tokens: int = 2048
    short_reply_threshold_tokens: int = 0
    memory_copy_watermark: float = 0.9
    copy_on_restore: bool = False
    branch_tail_tokens: int = 32 * 1024
    not_yet: bool = False

    def __post_init__(self) -> None:
        _check_types(self, "placement")
        for name in (
            "agent_context_threshold_tokens",
            "branch_tail_tokens",
            "long_reply_threshold_tokens",
            "short_reply_threshold_tokens",
        ):
            v = getattr(self, name)
            _check(isinstance(v, int) and v >= 0, f"placement.{name}", v, "must be an int >= 0")
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
    """Watermarks as fractions of each medium's capacity.

    Reclaim starts when use crosses ``*_high`` and drops whole sessions, oldest last
    access first, until use is at or under ``*_low``.
    """

    ssd_high: float = 0.90
    ssd_low: float = 0.80
    memory_high: float = 0.90
    memory_low: float = 0.80

    def __post_init__(self) -> None:
        _check_types(self, "reclaim")
        for medium in ("ssd", "memory"):
            hi, lo = getattr(self, f"{medium}_high"), getattr(self, f"{medium}_low")
            _check(0.0 < hi <= 1.0, f"reclaim.{medium}_high", hi, "must be in (0, 1]")
            _check(0.0 <= lo < hi, f"reclaim.{medium}_low", lo, f"must be in [0, {medium}_high)")


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    """Read planning (FC-CIO).

    ``gap_limit_bytes``: read through holes smaller than this between two wanted ranges
    of one file (the paper uses 64 KiB). ``max_read_bytes``: split merged reads larger
    than this so several commands stay in flight.
    """

    gap_limit_bytes: int = 64 * KIB
    max_read_bytes: int = 64 * MIB

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
    """FC-MAS restore scheduling.

    ``max_restores_in_flight``: SSD restores holding a staging window at once (the
    window is two layers per stream); further restores *wait* for a slot, never cancel.
    ``single_queue``: the one-FIFO-queue ablation.
    """

    max_restores_in_flight: int = 2
    single_queue: bool = False

    def __post_init__(self) -> None:
        _check_types(self, "scheduler")
        _check(self.max_restores_in_flight >= 1, "scheduler.max_restores_in_flight",
               self.max_restores_in_flight, "must be >= 1")


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Where and how much the store keeps on this node.

    ``memory_capacity_bytes`` and ``ssd_capacity_bytes`` are hard budgets enforced at
    allocation. ``session_file_bytes`` is the virtual span reserved for each session file
    in the node's SSD address space (files grow inside it; a session that outgrows it
    continues in a fresh span). ``io_mode``: ``direct`` requires O_DIRECT and fails with a
    clear error where the filesystem refuses it; ``buffered`` uses the page cache and says
    so in the log; ``auto`` tries direct and falls back to buffered with a warning.
    ``read_threads``: threads of the store's one reader (``preadv`` calls running at
    once, over all restores). ``reads_in_flight``: read commands one restore keeps with
    that reader at once; the rest of its reads wait in order (``cio.readers.ReadQueue``).
    ``thread_cpus``: the CPUs of the store's I/O threads (``cio.affinity``): ``auto``
    moves them off an engine's bound compute cores, ``inherit`` leaves them there, or a
    list such as ``1,3-5``.

    Beyond one node (``flatcake.cluster``; needs the ``redis`` client and NIXL):
    ``cluster_url`` (``redis://host:port/db``; empty = this node alone) is the cluster
    index's Redis. Set, the store joins the cluster as ``node_id`` (unique per node:
    it is bits 59..48 of every address), publishes its durable segments there, serves
    its arena and session files to peers, and restores blocks other nodes hold after
    its local prefix. ``cluster_name`` keeps deployments sharing one Redis apart;
    ``remote_timeout_s`` bounds one remote read (a dead or slow owner is a miss after
    it); ``remote_window_bytes`` is one receive window of remote reads (at least one
    layer of the largest segment); ``remote_windows`` is how many there are, each in
    its own client agent: that many remote reads run at once (default 3: one per
    restore in flight, ``scheduler.max_restores_in_flight``'s default 2, plus the
    all-memory load thread). A read that timed out retires its window (a late write
    may still land there); the store renews at most ``remote_windows`` of them, so the
    windows never take more than ``2 * remote_windows * remote_window_bytes``.

    One store per machine (``flatcake serve``, ``flatcake.service``): ``node`` is the
    node service's socket (``unix:/run/flatcake/node.sock`` or a plain path; empty = the
    store is embedded in this process, the default). Set in an engine's configuration,
    the engine attaches to that service instead of opening ``root`` itself: the
    service's budgets, root and books serve every engine attached to it.
    ``node_timeout_s`` bounds one call to the service (past it: a miss, one warning,
    and the engine re-attaches later); ``node_lease_s`` is how long the service keeps an
    engine that stopped calling (its pins released, its unfinished writes rolled back
    after it); ``node_arena_dir`` is where the service keeps its shared arena (a tmpfs
    or hugetlbfs mount; the arena file is readable by the service's user only).
    ``node_socket_group`` (a group name or gid; empty = none, the default: only the
    service's user and root attach) lets the members of that group attach too: the
    service makes its socket 0660 and its socket directory 0750, both that group's, and
    a client with the same key trusts a service socket of that group; the service's
    files (root, arena) stay its user's (``docs/node-service.md``: what a member can
    and cannot do). ``node_max_connections_per_uid`` (default 512; 0 = no cap): once
    one user holds more connections to the service, its longest-idle one is closed, so
    a flood of connections cannot starve a real client.

    ``release_old_windows`` (models with sliding-window layers): once a newer turn of a
    session is durable, the window rows of its older turns are superseded (no restore
    of the newest turn reads them; a hit ending at an older turn, a branch off it, a
    sub-agent, still does). They are released, punched out of the session file, when a
    store would cross the SSD high watermark, before any whole session is dropped;
    ``release_windows_at_once`` releases them as soon as the newer turn is durable (a
    session then holds about one window per sliding layer, and a hit ending at an older
    turn is cut back and recomputed). False keeps every turn's window until the session
    is reclaimed. ``window_rows``: where a turn keeps window rows, so where a later
    hit may end. ``"turn-ends"`` (default): at each turn's end. ``"branches"``: also
    where a prompt branches off a stored prefix that holds no window there (a shared
    system prompt, a sub-agent, an edit): the segment then starts a window before the
    branch and keeps the window's rows there too (one window per branch), so a later
    hit ending at the branch is served. ``"every-block"``: at every block (every hit
    served, the most SSD bytes: on DeepSeek-V4-Flash 12.2 MB of compressor state per
    128-token block). ``window_row_stride_tokens`` (0 = off): with ``turn-ends`` or
    ``branches``, a turn also keeps the window at every multiple of this many prompt
    tokens (rounded to whole blocks), so a hit ending inside a turn (a prompt diverging
    where no one diverged before) is cut back by at most that many tokens; it costs one
    window of rows per stride (``block tokens / stride`` of ``every-block``'s window
    bytes). A turn keeping rows inside it keeps them when a newer turn is durable
    (other prompts end their hits there).
    """

    root: str = "./flatcake-data"
    node_id: int = 0
    memory_capacity_bytes: int = 4 * GIB
    ssd_capacity_bytes: int = 64 * GIB
    session_file_bytes: int = 64 * GIB
    io_mode: str = "auto"
    read_threads: int = 4
    reads_in_flight: int = 8
    thread_cpus: str = "auto"
    cluster_url: str = ""
    cluster_name: str = "flatcake"
    remote_timeout_s: float = 5.0
    remote_window_bytes: int = 64 * MIB
    remote_windows: int = 3
    node: str = ""
    node_timeout_s: float = 2.0
    node_lease_s: float = 30.0
    node_arena_dir: str = "/dev/shm"
    node_socket_group: str = ""
    node_max_connections_per_uid: int = 512
    release_old_windows: bool = True
    release_windows_at_once: bool = False
    window_rows: str = "turn-ends"
    window_row_stride_tokens: int = 0

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
class FlatCakeConfig:
    """The whole configuration; ``model`` names a geometry preset (``geometry.PRESETS``)."""

    model: str = "llama-3.1-8b"
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    reclaim: ReclaimConfig = field(default_factory=ReclaimConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    store: StoreConfig = field(default_factory=StoreConfig)


_SECTIONS: dict[str, type] = {
    "placement": PlacementConfig,
    "reclaim": ReclaimConfig,
    "planner": PlannerConfig,
    "scheduler": SchedulerConfig,
    "store": StoreConfig,
}


def _coerce(section: str, name: str, raw: Any, target: Any) -> Any:
    """Convert a string (env/CLI) or TOML value to the field's declared type."""
    if isinstance(raw, str) and target is not str:
        text = raw.strip()
        if target is bool or target == "bool":
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
    checked as ``load_config`` checks it."""
    return _apply(cfg, section, name, raw)


def _apply(cfg: FlatCakeConfig, section: str, name: str, raw: Any) -> FlatCakeConfig:
    if section == "" and name == "model":
        return dataclasses.replace(cfg, model=str(raw))
    if section not in _SECTIONS:
        raise ValueError(
            f"unknown config section {section!r}; known sections: {sorted(_SECTIONS)}"
        )
    cls = _SECTIONS[section]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if name not in fields:
        raise ValueError(
            f"unknown config field {section}.{name}; known fields: {sorted(fields)}"
        )
    value = _coerce(section, name, raw, fields[name].type)
    current = getattr(cfg, section)
    return dataclasses.replace(cfg, **{section: dataclasses.replace(current, **{name: value})})


SECTIONS = tuple(_SECTIONS)
"""The config sections an engine's extra config may set (nested or dotted)."""


def section_overrides(where: str, key: str, value: Any) -> list[str] | None:
    """The ``section.field=value`` overrides (``load_config``'s) of one entry of an
    engine's extra config: a section (``{"store": {"root": ...}}``) or a dotted field
    (``"store.root"``); ``None`` when ``key`` is neither. ``where`` names the engine's
    option in errors; a value must be a scalar."""
    if key in _SECTIONS:
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}.{key} must be an object of {key} fields, got "
                             f"{value!r}")
        return [_scalar_override(where, key, str(name), v) for name, v in value.items()]
    section, dot, name = key.partition(".")
    if dot and section in _SECTIONS:
        return [_scalar_override(where, section, name, value)]
    return None


def _scalar_override(where: str, section: str, name: str, value: Any) -> str:
    if isinstance(value, Mapping | list | tuple):
        raise ValueError(f"{where} {section}.{name} must be a scalar, got {value!r}")
    if isinstance(value, bool):
        value = "true" if value else "false"
    return f"{section}.{name}={value}"


def load_config(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Sequence[str] = (),
) -> FlatCakeConfig:
    """Build a config from defaults, a TOML file, ``FLATCAKE_*`` env vars and overrides."""
    cfg = FlatCakeConfig()
    if path is not None:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
        for key, value in data.items():
            if isinstance(value, dict):
                for name, raw in value.items():
                    cfg = _apply(cfg, key, name, raw)
            else:
                cfg = _apply(cfg, "", key, value)
    environ = os.environ if env is None else env
    for key, raw in sorted(environ.items()):
        if not key.startswith("FLATCAKE_"):
            continue
        rest = key[len("FLATCAKE_"):].lower()
        if rest == "model":
            cfg = _apply(cfg, "", "model", raw)
        elif "__" in rest:
            section, name = rest.split("__", 1)
            cfg = _apply(cfg, section, name, raw)
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"config override {item!r} must look like section.field=value")
        dotted, raw = item.split("=", 1)
        section, _, name = dotted.strip().rpartition(".")
        cfg = _apply(cfg, section, name, raw)
    return cfg
