"""The scheduler half's per-request books, its books of the turn stores in flight, the
keys of an engine's requests, block events and counters (engine-neutral, no torch).

A store is in flight from ``StoreBooks.add`` (its address allocated) until every
worker reported it (``done``), when the host completes it in the books. Which keys are
being written is the books' own (``ControlPlane.store_in_flight``, read by
``plan.requests.servable``)."""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from flatcake.control import StorePlan
from flatcake.control.address import Medium
from flatcake.control.index import EMPTY_HIT, PrefixHit
from flatcake.control.keys import EngineKeys, namespace_key
from flatcake.control.signals import TurnInfo
from flatcake.plan.remote import RemoteRun
from flatcake.plan.requests import by_medium
from flatcake.plan.tasks import LoadTask, StoreDone, StoreTask

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RequestView:
    """What the connector reads off an engine request.

    Attributes:
        request_id: the engine's id.
        keys: FlatCake block keys of the request's full blocks (prompt and output).
        num_tokens: prompt + output tokens so far.
        num_prompt_tokens: prompt tokens (the turn's context).
        num_output_tokens: tokens generated (the turn's reply).
        num_computed_tokens: tokens whose KV is in the paged cache.
        session_param: ``kv_transfer_params["session_id"]``, ``None`` when absent.
    """

    request_id: str
    keys: tuple[bytes, ...]
    num_tokens: int
    num_prompt_tokens: int
    num_output_tokens: int = 0
    num_computed_tokens: int = 0
    session_param: object = None


class HashedRequest(Protocol):
    """What ``RequestKeys`` reads off an engine request (vLLM's ``Request``)."""

    @property
    def request_id(self) -> str: ...
    @property
    def block_hashes(self) -> Sequence[bytes]: ...
    @property
    def cache_salt(self) -> str | None: ...


class RequestKeys:
    """FlatCake keys of the requests' full blocks: the engine block hash ending each
    block, in the namespace of (model, tenant_salt, cache_salt) (``control.keys``).

    Converted incrementally as a request grows (a request's keys are never converted
    twice), and each namespace's ``EngineKeys`` remembers the keys of
    ``capacity`` recent engine hashes, so a prompt the engine has seen before (one its
    prefix cache serves) hashes nothing. ``hashes_per_block``: engine hash blocks per
    FlatCake block. One thread (the engine's scheduler)."""

    MAX_NAMESPACES = 64  # cache_salts remembered; past it the least recent goes

    def __init__(self, model: str, tenant_salt: str, hashes_per_block: int,
                 capacity: int = 1 << 16) -> None:
        self._model = model
        self._tenant_salt = tenant_salt
        self._step = hashes_per_block
        self._capacity = capacity
        self._spaces: OrderedDict[str | None, EngineKeys] = OrderedDict()
        # request -> (its namespace's keys, engine hashes converted, keys)
        self._keys: dict[str, tuple[EngineKeys, int, tuple[bytes, ...]]] = {}

    @property
    def num_hashed(self) -> int:
        """Digests computed since start, over every namespace still remembered."""
        return sum(space.num_hashed for space in self._spaces.values())

    def _space(self, cache_salt: str | None) -> EngineKeys:
        space = self._spaces.get(cache_salt)
        if space is None:
            ns = namespace_key(self._model, self._tenant_salt, cache_salt)
            space = self._spaces[cache_salt] = EngineKeys(ns, self._capacity)
            if len(self._spaces) > self.MAX_NAMESPACES:
                self._spaces.popitem(last=False)
        else:
            self._spaces.move_to_end(cache_salt)
        return space

    def keys(self, request: HashedRequest) -> tuple[bytes, ...]:
        """The keys of ``request``'s full blocks so far."""
        hashes = request.block_hashes
        entry = self._keys.get(request.request_id)
        if entry is not None and entry[1] >= len(hashes):
            return entry[2]  # nothing new: no work, however long the prompt
        step = self._step
        space, done, keys = entry if entry is not None else (
            self._space(request.cache_salt), 0, ())
        keys = keys + space.keys(hashes[done + step - 1::step])
        self._keys[request.request_id] = (space, len(hashes) - len(hashes) % step, keys)
        return keys

    def engine_hash(self, request: HashedRequest, block: int) -> bytes:
        """The engine's hash ending FlatCake block ``block`` of ``request``."""
        return bytes(request.block_hashes[(block + 1) * self._step - 1])

    def forget(self, request_id: str) -> None:
        self._keys.pop(request_id, None)


@dataclass(slots=True)
class RequestBooks:
    """Books of one live request (mutable, scheduler thread); its load's phase is the
    request driver's (``plan.driver.Tracked``)."""

    turn: TurnInfo
    hit: PrefixHit = EMPTY_HIT
    local_blocks: int = 0
    remote: tuple[RemoteRun, ...] = ()  # runs other nodes hold after the local hit
    hit_blocks: int = 0
    loaded_memory_blocks: int = 0
    loaded_ssd_blocks: int = 0
    loaded_remote_blocks: int = 0
    load_error_blocks: int = 0
    store_planned: bool = False
    backed_off: bool = False  # an SSD hit recomputed while the disk hung (counted once)
    held_whole: bool = False  # its last lookup found every full prompt block held
    store: StorePlan | None = None

    def count_load(self, task: LoadTask, loaded: int, stats: Counter[str], bs: int) -> None:
        """The request's load ``task`` ended with request blocks ``[0, loaded)`` in place
        (local ones by medium, then remote ones); the rest of it are load errors."""
        mem, ssd = by_medium(self.hit, task.first_block, loaded)
        far = max(0, loaded - task.num_blocks)
        errors = task.remote_end - max(loaded, task.first_block)
        self.loaded_memory_blocks += mem
        self.loaded_ssd_blocks += ssd
        self.loaded_remote_blocks += far
        self.load_error_blocks += errors
        counts = {"loaded_tokens_memory": mem * bs, "loaded_tokens_ssd": ssd * bs,
                  "loaded_tokens_remote": far * bs, "load_error_blocks": errors}
        stats.update(counts)

    def params(self, bs: int, session_id: str) -> dict[str, Any]:
        """What the connector did for the request, returned to the client in the
        output's ``kv_transfer_params`` (``session_id``: its session, as the client
        names it)."""
        out: dict[str, Any] = {
            "session_id": session_id,
            "turn_index": self.turn.turn_index,
            "session_inferred": self.turn.inferred,
            "hit_tokens": self.hit_blocks * bs,
            "loaded_tokens_memory": self.loaded_memory_blocks * bs,
            "loaded_tokens_ssd": self.loaded_ssd_blocks * bs,
            "load_error_blocks": self.load_error_blocks,
        }
        if self.remote:  # in a cluster, when other nodes held part of the hit
            out["loaded_tokens_remote"] = self.loaded_remote_blocks * bs
        if self.store is not None:
            out.update(store_params(self.store))
        return {"flatcake": out}


def store_params(plan: StorePlan) -> dict[str, Any]:
    """What ``RequestBooks.params`` says of the request's store ``plan``."""
    return {"stored_blocks": plan.segment.num_blocks,
            "placement": f"{plan.medium.name.lower()}:{plan.placement.rule.value}"}


class StoreBooks:
    """Stores in flight for ``world_size`` workers that each report every store."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._new: list[StoreTask] = []  # planned, not yet in a step
        # seg id -> the task and its workers' reports so far
        self._stores: dict[int, tuple[StoreTask, list[StoreDone]]] = {}

    def add(self, task: StoreTask) -> None:
        """A store planned: it goes to the workers with the next step."""
        self._new.append(task)
        self._stores[task.plan.segment.segment_id] = (task, [])

    def take_new(self) -> list[StoreTask]:
        """The stores planned since the last call (this step's)."""
        out, self._new = self._new, []
        return out

    def writing(self) -> set[str]:
        """Requests with a store in flight."""
        return {task.request_id for task, _reports in self._stores.values()}

    def done(self, report: StoreDone) -> tuple[StoreTask, bool, list[StoreDone]] | None:
        """One worker's report of a store. Once every worker reported it: the task,
        whether all of them wrote it, and their reports; None before."""
        entry = self._stores.get(report.segment_id)
        if entry is None:
            logger.warning("report for unknown store of segment %d", report.segment_id)
            return None
        task, reports = entry
        reports.append(report)
        if len(reports) < self.world_size:
            return None
        del self._stores[report.segment_id]
        return task, all(r.ok for r in reports), reports

    def abandon(self) -> tuple[list[tuple[StoreTask, int]], list[StoreTask]]:
        """Every store in flight, forgotten (its engine is gone): those handed to the
        workers (they may still write them), each with its workers' reports so far, and
        those not yet in a step."""
        new = {task.plan.segment.segment_id for task in self._new}
        handed = [(task, len(reports)) for seg_id, (task, reports) in self._stores.items()
                  if seg_id not in new]
        out = handed, self._new
        self._stores.clear()
        self._new = []
        return out

    def __len__(self) -> int:
        """Stores planned and not yet reported by every worker."""
        return len(self._stores)

    def has_pending(self) -> bool:
        return bool(self._stores) or bool(self._new)


@dataclass(frozen=True, slots=True)
class BlockEvent:
    """Blocks FlatCake started or stopped serving (for KV-aware routers).

    Attributes:
        stored: ``True``: the blocks were published (durable); ``False``: dropped
            (reclaim, or a session cut before a damaged segment).
        keys: FlatCake keys of the blocks, in prefix order.
        medium: where they live(d).
        layers: with ``stored=False``, only these layers' rows were dropped (window
            rows a newer turn superseded, ``control.releases``): the blocks stay for
            longer hits, but no hit ends in them any more; empty: the whole blocks.
    """

    stored: bool
    keys: tuple[bytes, ...]
    medium: Medium
    layers: tuple[int, ...] = ()


COUNTER_KEYS = (  # counters the connector reports, per stats interval
    "prompt_tokens",            # prompt tokens looked up (the hit rate's denominator)
    "hit_tokens",               # tokens the index held when the request was admitted
    "loaded_tokens_memory",     # tokens delivered to the engine's KV from host memory
    "loaded_tokens_ssd",        # tokens delivered from SSD (verified)
    "loaded_tokens_remote",     # tokens delivered from other nodes (verified)
    "load_error_blocks",        # hit blocks not delivered (corrupt / unreadable): recomputed
    "damaged_segments",         # segments that failed their crc32
    "restores_started",         # SSD restores started by FC-MAS
    "staging_slot_waits",       # SSD restores that found every staging window busy
    "loads_staged",             # SSD restores read through staging, not into the slots
    "loads_late",               # loads in the step given up at their deadline: recomputed
    "loads_backed_off",         # SSD hits recomputed while a given-up load still reads
    "stores_ok",
    "stores_failed",
    "stores_rejected",          # no medium could take the turn (CapacityError)
    "write_backs",              # not-yet homes reclaim handed to the SSD (stores too)
    "stored_blocks_memory",
    "stored_blocks_ssd",
    "lookup_waits",             # lookups deferred behind a store of the same prefix
    "cluster_lookup_failures",  # cluster index lookups that failed (answered local-only)
)


@dataclass(slots=True)
class Counters:
    """The connector's counters (``COUNTER_KEYS``) and placements per rule: per stats
    interval (``take``) and since start (``totals``)."""

    stats: Counter[str] = field(default_factory=Counter)
    placements: Counter[str] = field(default_factory=Counter)
    _total: Counter[str] = field(default_factory=Counter)

    def _placement_counts(self) -> dict[str, int]:
        return {f"placements.{r}": n for r, n in self.placements.items()}

    def take(self, gauges: dict[str, int]) -> dict[str, int | float]:
        """Counters since the last call (zeros left out), plus ``gauges``."""
        out: dict[str, int | float] = {k: v for k, v in self.stats.items() if v}
        out.update({k: n for k, n in self._placement_counts().items() if n})
        self._total.update(self.stats)
        self._total.update(self._placement_counts())
        self.stats.clear()
        self.placements.clear()
        out.update(gauges)
        return out

    def totals(self) -> dict[str, int]:
        """Counters since start (what ``take`` handed out plus what it has not)."""
        total = Counter(self._total)
        total.update(self.stats)
        total.update(self._placement_counts())
        return dict(total)
