"""FlatCake as an SGLang HiCache L3 storage backend (``FlatCakeHiCacheStorage``).

Launch SGLang with::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "flatcake",
        "module_path": "flatcake.connectors.sglang",
        "class_name": "FlatCakeHiCacheStorage", "interface_v1": 1,
        "store": {"root": "/nvme/flatcake"}, "tenant_salt": "team-a"}'

The extra config takes the configuration's own keys, as the vLLM connector's does: the
one parser (``config.load_extra_config``, by ``sglang_pool.parse_sglang_config``) and the
same ``[engine]`` section (``tenant_salt``, ``model_name``, ``max_sessions``, ...).
Every call goes to one ``FlatCakeStore`` (the same books and executor as every host):

- ``batch_set_v1``: the batch's pages are stored as one turn (one layer-major segment),
  written, made durable and only then published; True for the pages the store holds
  afterwards.
- ``batch_get_v1``: the stored run of the batch is restored by the store (merged reads,
  every segment's crc32 checked); True for exactly the pages written to the pool and
  verified, so never a True after a False. A damaged segment is a miss from that page on.
- ``batch_exists``: the leading run of pages the store's books say it can serve: the
  index's hit, cut before the first segment the books know is damaged (a restore found
  its crc32 wrong, or the restart scan found its header or length wrong). Data crcs are
  not read here (that would cost a read of every page); damage not yet found by a read
  shows up as the first False of ``batch_get_v1``, and from then on here too.

Data path (``sglang_pool``): with ``layer_first`` or ``page_first_direct`` pools whose
base and per-layer page halves are 4 KiB-aligned (SGLang's default allocator maps the
pool, so the base is), the store reads straight into the pool's pages and writes from
them (``read_path`` "direct": no staging copy under O_DIRECT). Otherwise pages go
through an aligned bounce buffer, one copy each way (``read_path`` "bounce", with
``read_path_reason``). A direct read that hits a damaged segment has already put bytes
in the pages from that one on: they are reported False and zeroed, so no unverified
byte stays in the pool.

Sessions: a stored batch is a turn, placed by the same rule as the vLLM connector's and
the replay's (``control.signals.SessionTracker``): SGLang's page keys are chained hashes,
``extra_info.prefix_keys`` names the pages before a batch (its history), and the books say
how much of that history is stored and which session owns its end
(``FlatCakeStore.prefix_owner``, whichever process stored it: after a restart, or another
DP rank attached to the same node service). A batch extending a session's latest turn is
its next turn; a branch (the same history, another question) joins the owner's file up to
``placement.branch_tail_tokens``, then its heir's, and so do the batches that go on from
a branch (its reply, its next turns: SGLang names no request, so they cannot be told
apart); otherwise a new session starts.
SGLang's storage calls carry no request, so the previous reply length and the
shared-prefix refcount are not available (unknown reply, refcount 1): the placement rule
decides on turn and context alone.

Key space: a page key is ``engine_block_key(ns, hash)`` with ``ns`` over the model, the
tenant salt, and the pool's memory layout, dtype, page size, TP/PP ranks (SGLang's keys
carry none of them), so two layouts or two tenants never read each other's pages.

Hybrid models (Mamba or Gated DeltaNet states, sliding-window or indexer pools beside
the KV pool): SGLang's hybrid cache controller registers each of their host pools at
start (``register_mem_host_pool_v2``) and moves them with its v2 calls, which this
backend does not implement: any pool but the KV pool is refused there, by name, and the
server does not start (``sglang_pool.extra_pool_refusal``).

Threads: SGLang's backup and prefetch threads call in at once; the store is
thread-safe, and this class's own books sit under one lock.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

from flatcake.config import FlatCakeConfig
from flatcake.connectors.sglang_pool import (
    BounceBuffers,
    HostPoolView,
    extra_pool_refusal,
    parse_sglang_config,
)
from flatcake.control.keys import engine_block_key, namespace_key
from flatcake.control.signals import SessionTracker, TurnInfo, max_branch_blocks
from flatcake.errors import CapacityError
from flatcake.geometry import KVGeometry
from flatcake.store import FlatCakeStore, TurnSignals

logger = logging.getLogger(__name__)

STAT_KEYS = ("set_calls", "pages_set", "pages_set_failed", "get_calls", "pages_got",
             "pages_missed", "pages_got_memory", "pages_got_ssd", "exists_calls",
             "read_commands", "bytes_read", "damaged_segments", "bytes_written",
             "pages_read_direct", "pages_read_bounce", "pages_staged", "loads_zero_copy",
             "loads_staging", "pages_scrubbed")


def _engine_hash(key: str) -> bytes:
    if not isinstance(key, str) or not key:
        raise ValueError(f"SGLang page keys must be non-empty strings, got {key!r}")
    try:
        return bytes.fromhex(key)
    except ValueError:
        return key.encode("utf-8")


class FlatCakeHiCacheStorage(HiCacheStorage):
    """SGLang ``HiCacheStorage`` over a ``FlatCakeStore`` (zero-copy v1 interface)."""

    def __init__(self, storage_config: HiCacheStorageConfig | None,
                 kwargs: dict[str, Any] | None = None) -> None:
        extra = getattr(storage_config, "extra_config", None) or {}
        self.config: FlatCakeConfig = parse_sglang_config(extra)
        model = self.config.engine.model_name or getattr(storage_config, "model_name", None)
        if not model:
            raise ValueError("FlatCake needs the model name: SGLang's model_name or "
                             "model_name in the extra config")
        if getattr(storage_config, "is_mla_model", False) and \
                int(getattr(storage_config, "tp_size", 1) or 1) > 1:
            raise ValueError(
                "FlatCake's SGLang backend serves MLA pools with tp_size 1 only: SGLang "
                "writes rank-replicated MLA pages from one TP rank, and FlatCake's books "
                "are per process, so the other ranks would never find them")
        self.model = str(model)
        self._ranks = tuple(int(getattr(storage_config, name, 0) or 0)
                            for name in ("tp_rank", "tp_size", "pp_rank", "pp_size"))
        self._lock = threading.Lock()
        self._sessions = SessionTracker(max_sessions=self.config.engine.max_sessions,
                                        turns_in_parts=True)
        self._stats = dict.fromkeys(STAT_KEYS, 0)
        self.view: HostPoolView | None = None
        self.store: FlatCakeStore | None = None
        self._direct: list[torch.Tensor] | None = None
        self._path_reason = "no host pool registered"
        self._bounce: BounceBuffers | None = None
        self._ns = b""
        pool = (kwargs or {}).get("mem_pool_host")
        if pool is not None:
            self.register_mem_pool_host(pool)

    # -- set-up -----------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Takes the host pool's geometry and opens the store (restart recovery)."""
        super().register_mem_pool_host(mem_pool_host)
        if self.store is not None:
            self.store.close()
        view = HostPoolView(mem_pool_host)
        tp_rank, tp_size, pp_rank, pp_size = self._ranks
        layout = f"mla-{view.layout}" if view.mla else view.layout
        space = (f"sglang|layout={layout}|dtype={view.dtype_name}|page={view.page_size}"
                 f"|tp={tp_rank}/{tp_size}|pp={pp_rank}/{pp_size}")
        self._ns = namespace_key(self.model, self.config.engine.tenant_salt, space)
        config = self.config
        root = Path(config.store.root) / f"tp{tp_rank}-pp{pp_rank}"
        self.view = view
        self._path_reason = view.direct_refusal()
        self._direct = None if self._path_reason else view.direct_caches()
        self._bounce = BounceBuffers(view)
        geometry = view.geometry(f"sglang-{self.model}")
        self._sessions = self._tracker(geometry)
        self.store = FlatCakeStore.open(root, geometry, config,
                                        tenant_salt=config.engine.tenant_salt)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """SGLang's hybrid cache controller registers each host pool of a hybrid model
        here at start, the KV pool among them: any other (a Mamba or Gated DeltaNet
        state, sliding-window or indexer pool) is refused by name
        (``sglang_pool.extra_pool_refusal``), so the server does not start rather than
        fail at its first prefetch."""
        why = extra_pool_refusal(host_pool, host_pool_name)
        if why:
            raise ValueError(why)
        base = getattr(super(), "register_mem_host_pool_v2", None)
        if base is not None:
            base(host_pool, host_pool_name)

    def _tracker(self, geometry: KVGeometry) -> SessionTracker:
        return SessionTracker(max_sessions=self.config.engine.max_sessions,
                              turns_in_parts=True, max_branch_blocks=max_branch_blocks(
                                  self.config.placement, geometry))

    def _ready(self) -> tuple[FlatCakeStore, HostPoolView]:
        if self.store is None or self.view is None:
            raise ValueError("register_mem_pool_host must be called before I/O")
        return self.store, self.view

    def _keys(self, keys: Sequence[str]) -> tuple[bytes, ...]:
        if isinstance(keys, str) or not isinstance(keys, Sequence):
            raise ValueError(f"keys must be a list of page keys, got {type(keys).__name__}")
        return tuple(engine_block_key(self._ns, _engine_hash(k)) for k in keys)

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, d in deltas.items():
                self._stats[name] += d

    # -- the v1 interface ---------------------------------------------------------

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        store, _ = self._ready()
        self._count(exists_calls=1)
        if not keys:
            return 0
        try:
            return store.lookup(self._keys(keys)).num_blocks
        except (ValueError, ConnectionError):  # closed by clear(), or the node service
            # is gone (a miss: SGLang recomputes)
            return 0

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: Any = None) -> list[bool]:
        store, view = self._ready()
        bkeys = self._keys(keys)
        if not bkeys:
            return []
        pages = view.pages(host_indices, len(bkeys))
        prefix = self._keys(list(getattr(extra_info, "prefix_keys", None) or []))
        self._count(set_calls=1)
        turn = self._turn(store, prefix)
        blocks = len(prefix) + len(bkeys)
        signals = TurnSignals(turn_index=turn.turn_index,
                              context_tokens=blocks * view.page_size,
                              prev_reply_tokens=turn.prev_reply_tokens)
        bounce = None
        try:
            if self._direct is not None:  # the writer reads the pool's pages themselves
                caches, ids = self._direct, pages
            else:
                bounce, caches = self._bounce_for(len(bkeys))
                view.gather(pages, caches)
                ids = torch.arange(len(bkeys))
            result = store.store_turn(turn.session_id, bkeys, caches, ids, signals)
            stored = store.lookup(bkeys).num_blocks if not result.error else 0
            written = result.bytes_written
        except (CapacityError, OSError, ValueError) as exc:
            logger.warning("FlatCake: batch_set_v1 of %d pages failed: %s", len(bkeys), exc)
            stored, written = 0, 0
        finally:
            if bounce is not None:
                self._bounce_give(bounce)
        with self._lock:
            self._stats["pages_set"] += stored
            self._stats["pages_set_failed"] += len(bkeys) - stored
            self._stats["bytes_written"] += written
            if stored == len(bkeys):
                self._sessions.finish_turn(turn, None, blocks)
        return [i < stored for i in range(len(bkeys))]

    def _turn(self, store: FlatCakeStore, prefix: tuple[bytes, ...]) -> TurnInfo:
        """The turn a batch after the pages ``prefix`` is (``SessionTracker.resolve``
        on the stored part of ``prefix`` and its owner in the books)."""
        try:
            hit_blocks, owner = store.prefix_owner(prefix) if prefix else (0, None)
        except (ValueError, ConnectionError):  # closed, or the node service is gone
            hit_blocks, owner = 0, None
        with self._lock:
            return self._sessions.resolve(None, hit_blocks, owner)

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: Any = None) -> list[bool]:
        store, view = self._ready()
        bkeys = self._keys(keys)
        if not bkeys:
            return []
        pages = view.pages(host_indices, len(bkeys))
        if self._direct is not None:
            return self._get_direct(store, view, self._direct, bkeys, pages)
        bounce, layers = self._bounce_for(len(bkeys))
        try:
            result = store.load(bkeys, layers, torch.arange(len(bkeys)))
            got = result.num_blocks
            view.scatter(layers, pages[:got])
        except (ValueError, ConnectionError):  # closed by clear(), or the node service
            # is gone (a miss: SGLang recomputes)
            return [False] * len(bkeys)
        finally:
            self._bounce_give(bounce)
        staged = got * (2 if result.read_path == "staging" else 1)
        self._count_load(result, len(bkeys), pages_read_bounce=got, pages_staged=staged)
        return [i < got for i in range(len(bkeys))]

    def _get_direct(self, store: FlatCakeStore, view: HostPoolView, caches: list[torch.Tensor],
                    bkeys: tuple[bytes, ...], pages: torch.Tensor) -> list[bool]:
        """Restore straight into the pool's pages (``read_path`` "direct")."""
        try:
            result = store.load(bkeys, caches, pages)
        except (ValueError, ConnectionError):  # closed by clear(), or the node service
            # is gone (a miss: SGLang recomputes)
            return [False] * len(bkeys)
        got = result.num_blocks
        scrub = 0
        if result.read_path == "zero-copy" and got < result.num_hit_blocks:
            # Bytes past a damaged segment already sit in these pages: never leave them.
            view.zero(pages[got:result.num_hit_blocks])
            scrub = result.num_hit_blocks - got
        staged = got if result.read_path == "staging" else 0
        self._count_load(result, len(bkeys), pages_read_direct=got, pages_staged=staged,
                         pages_scrubbed=scrub)
        return [i < got for i in range(len(bkeys))]

    def _bounce_for(self, n: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        if self._bounce is None:
            raise ValueError("register_mem_pool_host must be called before I/O")
        return self._bounce.take(n)

    def _bounce_give(self, buf: torch.Tensor) -> None:
        if self._bounce is not None:
            self._bounce.give(buf)

    def _count_load(self, result: Any, asked: int, **deltas: int) -> None:
        zero_copy = result.read_path == "zero-copy"
        self._count(get_calls=1, pages_got=result.num_blocks,
                    pages_missed=asked - result.num_blocks,
                    pages_got_memory=result.num_memory_blocks,
                    pages_got_ssd=result.num_ssd_blocks, read_commands=result.commands,
                    bytes_read=result.bytes_read, damaged_segments=result.damaged_segments,
                    loads_zero_copy=int(zero_copy), loads_staging=int(not zero_copy),
                    **deltas)

    # -- the legacy interface (SGLang calls it only without interface_v1) ----------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        raise NotImplementedError("FlatCake serves SGLang's zero-copy interface: set "
                                  "interface_v1 to 1 in the extra config")

    def batch_get(self, keys: list[str], target_locations: Any = None,
                  target_sizes: Any = None) -> Any:
        raise NotImplementedError("FlatCake serves SGLang's zero-copy interface: set "
                                  "interface_v1 to 1 in the extra config")

    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:
        raise NotImplementedError("FlatCake serves SGLang's zero-copy interface: set "
                                  "interface_v1 to 1 in the extra config")

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        raise NotImplementedError("FlatCake serves SGLang's zero-copy interface: set "
                                  "interface_v1 to 1 in the extra config")

    # -- housekeeping -----------------------------------------------------------------

    def clear(self) -> None:
        """Drops every stored page of this rank (its store root is emptied). Attached to
        a node service the root is the machine's, shared with other engines: refused."""
        store, _ = self._ready()
        if store.attached:
            raise ValueError("clear() empties the store root, which the node service "
                             "shares with every engine on this machine: stop the service "
                             "and delete its root instead")
        root, geometry, config = store.root, store.geometry, store.config
        with self._lock:
            store.close()
            shutil.rmtree(root, ignore_errors=True)
            self.store = FlatCakeStore.open(root, geometry, config,
                                            tenant_salt=config.engine.tenant_salt)
            self._sessions = self._tracker(geometry)

    def get_stats(self) -> dict[str, Any]:
        with self._lock:
            stats: dict[str, Any] = dict(self._stats)
        stats["read_path"] = "direct" if self._direct is not None else "bounce"
        stats["read_path_reason"] = self._path_reason
        if self.store is not None:
            stats["store"] = self.store.inspect()
        return stats

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
