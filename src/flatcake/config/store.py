"""The ``[store]`` section: where and how much the store keeps on this node, and how it
meets the node service and the other nodes."""

from __future__ import annotations

from dataclasses import dataclass

from flatcake.config.checks import GIB, KIB, MIB, check, check_types

WINDOW_ROWS = ("branches", "turn-ends", "every-block")
"""``store.window_rows``: where a turn keeps sliding-window rows."""


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
    (files grow inside it; a session that outgrows it continues in a fresh span). The
    space (2**48 bytes) maps 2**48 / this many files at once, 4,096 at the default:
    past ``reclaim.ssd_high`` of them a new file reclaims the least recently used
    sessions down to ``reclaim.ssd_low``, as bytes do. Many short sessions on a large
    drive want a smaller span."""
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
    window_row_stride_dense_tokens: int = 0
    """With a stride, space a turn's rows by their distance from its end: the stride
    points less than this many prompt tokens before the end are all kept; further back
    the spacing doubles at this distance and at each doubling of the distance after
    (about ``this / (2 x stride)`` rows per doubling), so a long turn (a tool's output
    of many thousand tokens) keeps a few rows where a hit may end far inside it rather
    than one every stride. 0: the stride everywhere. The rows stay at multiples of the
    stride counted from the request's first block."""

    def __post_init__(self) -> None:
        check_types(self, "store")
        check(self.window_row_stride_tokens >= 0, "store.window_row_stride_tokens",
               self.window_row_stride_tokens, "must be >= 0 (0 = no stride)")
        check(self.window_row_stride_dense_tokens >= 0,
               "store.window_row_stride_dense_tokens", self.window_row_stride_dense_tokens,
               "must be >= 0 (0 = the stride everywhere)")
        check(self.window_rows in WINDOW_ROWS, "store.window_rows", self.window_rows,
               f"must be one of {', '.join(WINDOW_ROWS)}")
        check(self.node_timeout_s > 0, "store.node_timeout_s", self.node_timeout_s,
               "must be > 0")
        check(self.node_lease_s >= 1, "store.node_lease_s", self.node_lease_s,
               "must be >= 1")
        check(self.node_max_connections_per_uid >= 0,
               "store.node_max_connections_per_uid", self.node_max_connections_per_uid,
               "must be >= 0 (0: no cap)")
        check(not self.cluster_url or self.cluster_url.startswith(
            ("redis://", "rediss://", "unix://")), "store.cluster_url", self.cluster_url,
            "must be a Redis URL (redis://host:port/db, rediss://..., unix://...) or empty")
        check(bool(self.cluster_name) and ":" not in self.cluster_name,
               "store.cluster_name", self.cluster_name, "must be non-empty without ':'")
        check(self.remote_timeout_s > 0, "store.remote_timeout_s", self.remote_timeout_s,
               "must be > 0")
        check(self.remote_window_bytes >= 4 * KIB, "store.remote_window_bytes",
               self.remote_window_bytes, "must be >= 4096")
        check(1 <= self.remote_windows <= 64, "store.remote_windows", self.remote_windows,
               "must be in [1, 64]")
        check(0 <= self.node_id < 4096, "store.node_id", self.node_id, "must be in [0, 4096)")
        check(self.memory_capacity_bytes >= 0, "store.memory_capacity_bytes",
               self.memory_capacity_bytes, "must be >= 0")
        check(self.ssd_capacity_bytes >= 0, "store.ssd_capacity_bytes",
               self.ssd_capacity_bytes, "must be >= 0")
        check(4 * KIB <= self.session_file_bytes <= 1 << 47 and
              self.session_file_bytes % (4 * KIB) == 0,
              "store.session_file_bytes", self.session_file_bytes,
              "must be a multiple of 4096 in [4096, 2**47] (the SSD space is 2**48 bytes)")
        check(self.io_mode in ("auto", "direct", "buffered"), "store.io_mode", self.io_mode,
               "must be one of auto, direct, buffered")
        check(self.read_threads >= 1, "store.read_threads", self.read_threads, "must be >= 1")
        check(self.reads_in_flight >= 1, "store.reads_in_flight", self.reads_in_flight,
               "must be >= 1")
        if self.thread_cpus not in THREAD_CPUS_WORDS:
            try:
                parse_cpu_list(self.thread_cpus)
            except ValueError as exc:
                raise ValueError(f"invalid config store.thread_cpus={self.thread_cpus!r}: "
                                 f"must be auto, inherit or a CPU list like 0,2-3 ({exc})"
                                 ) from None


