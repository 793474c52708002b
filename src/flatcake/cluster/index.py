"""The cluster index: which node holds a block key, kept in Redis (metadata only).

Layout under the prefix ``fc:{cluster}:`` (one cluster name per deployment)::

    epoch:{node}       INCR counter; a node's epoch for this life (join bumps it)
    lease:{node}       "{epoch}" with a PX lease; renewed by the live node
    seg:{node}:{sid}   JSON: the segment record the remote reader needs
    k:{key hex}        hash, field "{node}" -> "{epoch}:{sid}:{position}:{address}"
    agent:{node}       hash: epoch, the node's transfer-agent metadata (NIXL's own
                       bytes) and a JSON record (agent name, registered arena base, size)
    agent:{node}:{role}  the same for a node's other agents (a store's clients:
                         ``client0``, ``client1``, ...)

Rules: a node publishes a segment only after its bytes are durable (the caller's
promise), removes its entries when it reclaims the segment, and re-publishes after
restart recovery under the new epoch it got from ``join``. A lookup trusts an entry only
when its node holds a live lease for the entry's epoch, so the entries of a node that is
gone (lease expired) or restarted (new epoch, not yet re-published) are ignored. Lookups
are batched: one server-side script returns the other nodes' fields of every key (for a
prefix it stops at the first key no other node holds), one MGET each for leases and
segment records. Tenant salts need nothing here: they are inside the block keys.

Redis errors and timeouts never hang a caller: a lookup that fails is a miss (logged) and
a publish that fails returns False (the node keeps serving locally).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from flatcake.control.address import Address, Medium
from flatcake.errors import ClusterUnavailableError

logger = logging.getLogger(__name__)

# The lease is taken only by the holder of the node's current epoch.
_RENEW = """
local cur = redis.call('GET', KEYS[1])
if cur == false or tonumber(cur) ~= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return 1
"""
_LEAVE = """
local cur = redis.call('GET', KEYS[1])
if cur ~= false and tonumber(cur) == tonumber(ARGV[1]) then redis.call('DEL', KEYS[2]) end
return 1
"""

# One string: per key, the fields of other nodes "node=value,node=value" ("" = none),
# keys joined by ";" (one reply to parse, not one per key); ARGV[1] = the asking node,
# ARGV[2] = "1": stop at the first key with none (a prefix).
_FIELDS = """
local out = {}
for i, key in ipairs(KEYS) do
  local row = redis.call('HGETALL', key)
  local parts = {}
  for j = 1, #row, 2 do
    if row[j] ~= ARGV[1] then parts[#parts + 1] = row[j] .. '=' .. row[j + 1] end
  end
  if #parts == 0 and ARGV[2] == '1' then break end
  out[i] = table.concat(parts, ',')
end
return table.concat(out, ';')
"""


class StaleNodeError(RuntimeError):
    """Another process joined with this node id: this one's epoch is over."""


@dataclass(frozen=True, slots=True)
class RemoteHit:
    """One block key found on a live node: where its bytes are and the segment record."""

    key: bytes
    node: int
    epoch: int
    segment_id: int
    position: int
    address: int
    record: Mapping[str, Any]

    @property
    def medium(self) -> Medium:
        return Address.decode(self.address).medium


def _redis_errors() -> tuple[type[BaseException], ...]:
    """The Redis client's own error types (connection refused, timeouts), when installed."""
    try:
        from redis.exceptions import RedisError
    except ImportError:
        return (ConnectionError, TimeoutError)
    return (RedisError, ConnectionError, TimeoutError)


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=f"{user}{host}{port}"))


class ClusterIndex:
    """One node's view of the cluster index (``node`` in [0, 4095], as in addresses)."""

    def __init__(self, url: str, node: int, *, cluster: str = "flatcake",
                 lease_ms: int = 10_000, timeout_s: float = 2.0, client: Any = None) -> None:
        if not 0 <= node <= 4095:
            raise ValueError(f"node id must be in [0, 4095], got {node!r}")
        if lease_ms < 100:
            raise ValueError(f"lease_ms must be at least 100, got {lease_ms!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        if not cluster or ":" in cluster:
            raise ValueError(f"cluster name must be non-empty without ':', got {cluster!r}")
        if client is None:
            try:
                import redis
            except ImportError as exc:
                raise RuntimeError("the cluster index needs the redis client "
                                   "(pip install redis)") from exc
            client = redis.Redis.from_url(url, socket_timeout=timeout_s,
                                          socket_connect_timeout=timeout_s)
        self._r = client
        self.url = _without_password(url)
        self.node = node
        self.lease_ms = lease_ms
        self.epoch = 0  # 0 = not joined
        self._p = f"fc:{cluster}:"
        self._renew = self._r.register_script(_RENEW)
        self._leave = self._r.register_script(_LEAVE)
        self._fields = self._r.register_script(_FIELDS)
        self.round_trips = 0  # batched calls made to Redis (for tests and stats)
        self.failures = 0  # calls that failed or timed out (a caller may back off)

    # -- membership -----------------------------------------------------------------
    def join(self) -> int:
        """Start a new life of this node: a new epoch and a lease. Entries published under
        older epochs are ignored from now on until re-published."""
        try:
            self.epoch = int(self._r.incr(f"{self._p}epoch:{self.node}"))
            self.round_trips += 1
            self.renew()
        except _redis_errors() as exc:
            self.epoch = 0
            raise ClusterUnavailableError(
                f"cannot join the cluster index at {self.url}: {exc} (is Redis running "
                f"there? store.cluster_url / --redis)") from exc
        return self.epoch

    def renew(self) -> None:
        """Extend the lease; raises ``StaleNodeError`` when a newer life took the node id."""
        self._need_joined()
        ok = self._renew(keys=[f"{self._p}epoch:{self.node}", f"{self._p}lease:{self.node}"],
                         args=[self.epoch, self.lease_ms])
        self.round_trips += 1
        if not ok:
            raise StaleNodeError(f"node {self.node} epoch {self.epoch} was superseded")

    def leave(self) -> None:
        """Drop the lease (a clean shutdown): every entry of this node is ignored at once."""
        if self.epoch:
            self._leave(keys=[f"{self._p}epoch:{self.node}", f"{self._p}lease:{self.node}"],
                        args=[self.epoch])
            self.round_trips += 1
            self.epoch = 0

    def live_epochs(self, nodes: Sequence[int]) -> dict[int, int]:
        """node -> live epoch, for the nodes that hold a lease now."""
        if not nodes:
            return {}
        values = self._r.mget([f"{self._p}lease:{n}" for n in nodes])
        self.round_trips += 1
        return {n: int(v) for n, v in zip(nodes, values, strict=True) if v is not None}

    # -- transfer agents -------------------------------------------------------------
    def publish_agent(self, metadata: bytes, record: Mapping[str, Any], *,
                      role: str = "") -> bool:
        """Publish this node's transfer-agent metadata (opaque bytes) and record for this
        epoch, so peers can connect without any socket protocol of ours. ``role`` names
        a second agent of the node (a store's ``client`` agent, say)."""
        self._need_joined()
        pipe = self._r.pipeline(transaction=False)
        pipe.hset(self._agent_key(self.node, role), mapping={
            "epoch": self.epoch, "md": bytes(metadata), "record": json.dumps(dict(record))})
        return self._run(pipe, "publish_agent") is not None

    def agent(self, node: int, role: str = "") -> tuple[bytes, dict[str, Any]] | None:
        """(metadata, record) of ``node``'s transfer agent (of ``role``), if it is live
        in the epoch that published it; None otherwise (a gone node is a miss)."""
        pipe = self._r.pipeline(transaction=False)
        pipe.hgetall(self._agent_key(node, role))
        pipe.get(f"{self._p}lease:{node}")
        out = self._run(pipe, "agent")
        if out is None or not out[0] or out[1] is None:
            return None
        row, lease = out
        if int(row[b"epoch"]) != int(lease):
            return None
        return bytes(row[b"md"]), json.loads(row[b"record"])

    # -- publishing -----------------------------------------------------------------
    def publish(self, segments: Sequence[tuple[int, Sequence[bytes], Sequence[int],
                                               Mapping[str, Any]]]) -> bool:
        """Publish durable segments, each ``(segment_id, keys, block addresses, record)``
        (one address per key: where that block's layer 0 lives on this node), in one
        pipeline. Also the re-publication after recovery. False when Redis failed."""
        self._need_joined()
        pipe = self._r.pipeline(transaction=False)
        for sid, keys, addresses, record in segments:
            if len(keys) != len(addresses):
                raise ValueError(f"segment {sid}: {len(keys)} keys but {len(addresses)} "
                                 "addresses")
            for a in addresses:
                if Address.decode(a).node != self.node:
                    raise ValueError(f"segment {sid}: address {Address.decode(a)} names "
                                     f"another node than {self.node}")
            pipe.set(f"{self._p}seg:{self.node}:{sid}", json.dumps(dict(record)))
            for pos, (key, addr) in enumerate(zip(keys, addresses, strict=True)):
                pipe.hset(self._key(key), str(self.node), f"{self.epoch}:{sid}:{pos}:{addr}")
        return self._run(pipe, "publish") is not None

    def remove(self, segments: Sequence[tuple[int, Sequence[bytes]]]) -> bool:
        """Remove reclaimed segments' entries (``(segment_id, keys)`` each); a key this
        node re-published from another segment keeps that entry. False when Redis failed."""
        pipe = self._r.pipeline(transaction=False)
        for _, keys in segments:
            for key in keys:
                pipe.hget(self._key(key), str(self.node))
        current = self._run(pipe, "remove")
        if current is None:
            return False
        pipe = self._r.pipeline(transaction=False)
        i = 0
        for sid, keys in segments:
            pipe.delete(f"{self._p}seg:{self.node}:{sid}")
            for key in keys:
                value = current[i]
                i += 1
                if value is not None and int(value.split(b":")[1]) == sid:
                    pipe.hdel(self._key(key), str(self.node))
        return self._run(pipe, "remove") is not None

    # -- lookups --------------------------------------------------------------------
    def lookup(self, keys: Sequence[bytes], *, local: Callable[[bytes], bool] | None = None,
               prefix: bool = True) -> list[RemoteHit]:
        """Where other live nodes hold ``keys``. The local index is consulted first
        (``local(key)`` true = served here, skipped); with ``prefix`` the result stops at
        the first key nobody holds (a restore needs a contiguous prefix). Memory copies
        win over SSD ones, then the lowest node id. Redis failing = no hits."""
        wanted = [k for k in keys if local is None or not local(k)]
        if not wanted:
            return []
        # Our own entries are the local index's business: the script leaves them out.
        try:
            rows = self._fields(keys=[self._key(k) for k in wanted],
                                args=[self.node, 1 if prefix else 0])
            self.round_trips += 1
        except Exception as exc:  # redis.RedisError and socket errors alike
            self.failures += 1
            logger.warning("cluster index lookup failed: %s", exc)
            return []
        entries: list[list[tuple[int, int, int, int, int]]] = []
        for row in rows.split(b";"):
            parsed = []
            for part in row.split(b",") if row else ():
                field, value = part.split(b"=", 1)
                epoch, sid, pos, addr = (int(x) for x in value.split(b":"))
                parsed.append((int(field), epoch, sid, pos, addr))
            entries.append(parsed)
        nodes = sorted({e[0] for row in entries for e in row})
        try:
            live = self.live_epochs(nodes)
        except Exception as exc:  # redis errors: a miss, never a hang
            self.failures += 1
            logger.warning("cluster index lookup failed: %s", exc)
            return []
        chosen: list[tuple[bytes, tuple[int, int, int, int, int]] | None] = []
        # With ``prefix`` the rows end at the first key no other node holds.
        for key, row in zip(wanted, entries, strict=False):
            ok = [e for e in row if live.get(e[0]) == e[1]]
            if len(ok) > 1:
                ok.sort(key=lambda e: (Address.decode(e[4]).medium != Medium.MEMORY, e[0]))
            chosen.append((key, ok[0]) if ok else None)
            if prefix and not ok:
                break
        picked = [c for c in chosen if c is not None]
        segs = sorted({(e[0], e[2]) for _, e in picked})
        records = self._records(segs)
        if records is None:
            return []
        hits = []
        for key, (node, epoch, sid, pos, addr) in picked:
            record = records.get((node, sid))
            if record is None:  # reclaimed between the two reads
                if prefix:
                    break
                continue
            hits.append(RemoteHit(key, node, epoch, sid, pos, addr, record))
        return hits

    def _records(self, segs: Sequence[tuple[int, int]]) -> dict[tuple[int, int], Any] | None:
        if not segs:
            return {}
        try:
            values = self._r.mget([f"{self._p}seg:{n}:{s}" for n, s in segs])
            self.round_trips += 1
        except Exception as exc:
            self.failures += 1
            logger.warning("cluster index lookup failed: %s", exc)
            return None
        return {ns: json.loads(v) for ns, v in zip(segs, values, strict=True) if v is not None}

    # -- helpers --------------------------------------------------------------------
    def _key(self, key: bytes) -> str:
        if not isinstance(key, bytes | bytearray) or not key:
            raise ValueError(f"block keys must be non-empty bytes, got {type(key).__name__}")
        return f"{self._p}k:{bytes(key).hex()}"

    def _agent_key(self, node: int, role: str) -> str:
        if ":" in role:
            raise ValueError(f"an agent role must not contain ':', got {role!r}")
        return f"{self._p}agent:{node}" + (f":{role}" if role else "")

    def _need_joined(self) -> None:
        if not self.epoch:
            raise ValueError(f"node {self.node} has not joined the cluster index (join())")

    def _run(self, pipe: Any, what: str) -> list[Any] | None:
        try:
            out = pipe.execute()
        except Exception as exc:  # redis.RedisError and socket errors alike
            self.failures += 1
            logger.warning("cluster index %s failed: %s", what, exc)
            return None
        self.round_trips += 1
        return list(out)

    def close(self) -> None:
        self._r.close()
