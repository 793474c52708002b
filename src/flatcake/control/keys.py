"""Block keys (FC-GVA): 32-byte chained prefix hashes over token blocks.

Block ``i``'s key is a keyed BLAKE2b digest of key ``i-1`` and block ``i``'s token ids,
where the BLAKE2b key is itself a digest of the model name and the tenant::

    ns      = blake2b(b"flatcake-ns-v1" | len(model) | model | len(salt) | salt
                      [| len(request_salt) | request_salt])                    # 32 B
    key[-1] = parent or 32 zero bytes
    key[i]  = blake2b(key[i-1] | int64-le token ids of block i, key=ns)           # 32 B

The tenant is two salts: ``tenant_salt`` (one per deployment) and ``request_salt``
(one per request, e.g. vLLM's ``cache_salt``; left out of the digest when absent, so a
store written without request salts keeps its keys). So a key names a whole prefix
(not one block), two models or two tenants never share a key, and without the salts
nobody can build a prefix that collides with another tenant's. Only full blocks get a
key (a partial last block is recomputed, never stored).

Engines that hash blocks themselves (vLLM, SGLang) keep their chained hashes (which
carry what tokens alone do not: multimodal inputs, LoRA); ``engine_block_key`` puts
each in the same namespace::

    key[i]  = blake2b(engine_hash[i], key=ns)                                      # 32 B

The vLLM connector does exactly that with ``ns = namespace_key(model, tenant_salt,
cache_salt)``, one namespace per request's ``cache_salt``: different salts never share
a key, in memory or on SSD, before or after a restart. ``as_block_key`` takes an
engine's hash as the key itself (no namespace) for hosts that namespace their own.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from flatcake.layout import KEY_BYTES

BlockKey = bytes
"""A block key: exactly ``KEY_BYTES`` (32) bytes; stored verbatim in segment headers."""

_NS_TAG = b"flatcake-ns-v1"
_ENGINE_TAG = b"flatcake-engine-hash-v1"
_MAX_TOKEN_ID = (1 << 63) - 1


def _as_bytes(value: str | bytes, field: str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise ValueError(f"{field} must be str or bytes, got {type(value).__name__}")


def namespace_key(model: str, tenant_salt: str | bytes = b"",
                  request_salt: str | bytes | None = None) -> bytes:
    """The 32-byte BLAKE2b key that namespaces every block key of (model, tenant).

    ``request_salt`` (vLLM's per-request ``cache_salt``) is a second tenant field;
    ``None`` or empty leaves it out, so the namespace equals the one without it."""
    if not isinstance(model, str) or not model:
        raise ValueError(f"model must be a non-empty str, got {model!r}")
    m = model.encode("utf-8")
    s = _as_bytes(tenant_salt, "tenant_salt")
    raw = _NS_TAG + struct.pack("<Q", len(m)) + m + struct.pack("<Q", len(s)) + s
    if request_salt is not None:
        r = _as_bytes(request_salt, "request_salt")
        if r:
            raw += struct.pack("<Q", len(r)) + r
    return hashlib.blake2b(raw, digest_size=KEY_BYTES).digest()


TENANT_TAG_BYTES = 16
_TENANT_TAG = b"flatcake-tenant-v1"


def tenant_tag(tenant_salt: str | bytes = b"") -> bytes:
    """Who the tenant of ``tenant_salt`` is, to the node service (which scopes session
    verbs by it): ``TENANT_TAG_BYTES`` of BLAKE2b of the salt (the salt itself never
    leaves the process), empty for no salt."""
    s = _as_bytes(tenant_salt, "tenant_salt")
    if not s:
        return b""
    return hashlib.blake2b(_TENANT_TAG + s, digest_size=TENANT_TAG_BYTES).digest()


def engine_block_key(namespace: bytes, engine_hash: bytes) -> BlockKey:
    """The key of a block an engine hashed itself (``engine_hash``: its chained block
    hash, e.g. vLLM's ``request.block_hashes[i]``), in ``namespace``."""
    if not isinstance(namespace, bytes) or len(namespace) != KEY_BYTES:
        raise ValueError(f"namespace must be {KEY_BYTES} bytes, got {namespace!r}")
    if not isinstance(engine_hash, bytes | bytearray | memoryview) or not engine_hash:
        raise ValueError(f"engine_hash must be non-empty bytes, got {engine_hash!r}")
    return hashlib.blake2b(bytes(engine_hash), digest_size=KEY_BYTES, key=namespace).digest()



def _nonempty_bytes(hashes: Sequence[bytes]) -> bool:
    """Every one of ``hashes`` is non-empty ``bytes`` (checked at C speed)."""
    try:
        return min(map(bytes.__len__, hashes), default=1) > 0
    except TypeError:  # not bytes: the per-hash loop converts or refuses it
        return False


class EngineKeys:
    """``engine_block_key`` of one namespace, remembering the keys of recent engine
    hashes: an engine asks for the same prefix again and again (every request its
    prefix cache serves; every step a request waits), and a remembered key costs a
    dict lookup where a digest costs a keyed BLAKE2b.

    ``capacity``: the engine hashes last asked for that are surely remembered; older
    ones are forgotten a generation at a time (an engine's hashes name whole prefixes,
    so a forgotten one is only hashed again). Two plain dicts, the newest generation
    and the one before, each of at most ``capacity`` hashes: a hash found in the older
    moves to the newest, and when the newest is full the older goes whole. Between
    ``capacity`` and twice as many are remembered; an insert is a plain dict's (an
    ``OrderedDict``'s links cost a new prompt's keys a third more).
    ``num_hashed`` counts the digests computed. One thread (the engine's scheduler)."""

    __slots__ = ("_base", "_capacity", "_new", "_old", "namespace", "num_hashed")

    def __init__(self, namespace: bytes, capacity: int = 1 << 16) -> None:
        if not isinstance(namespace, bytes) or len(namespace) != KEY_BYTES:
            raise ValueError(f"namespace must be {KEY_BYTES} bytes, got {namespace!r}")
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        self.namespace = namespace
        # Keyed BLAKE2b's first compression is over the key: copy that state per digest.
        self._base = hashlib.blake2b(digest_size=KEY_BYTES, key=namespace)
        self._capacity = capacity
        self._new: dict[bytes, BlockKey] = {}
        self._old: dict[bytes, BlockKey] = {}
        self.num_hashed = 0

    def __len__(self) -> int:
        """Engine hashes remembered."""
        return len(self._new) + len(self._old)

    def keys(self, engine_hashes: Sequence[bytes]) -> tuple[BlockKey, ...]:
        """The keys of ``engine_hashes`` (each as ``engine_block_key`` gives it)."""
        get = self._new.get
        try:
            out = list(map(get, engine_hashes))
        except TypeError:  # bytearray or memoryview hashes: as bytes
            engine_hashes = [bytes(h) if isinstance(h, bytearray | memoryview) else h
                             for h in engine_hashes]
            out = list(map(get, engine_hashes))
        try:
            first = out.index(None)
        except ValueError:
            return tuple(out)  # type: ignore[arg-type]
        # A chain misses from its first unseen block on: one tight loop over the rest.
        copy, old_get, capacity = self._base.copy, self._old.get, self._capacity
        new = self._new
        tail = engine_hashes[first:]
        if out.count(None) == len(tail) and len(new) + len(tail) < capacity and \
                not any(map(old_get, tail)) and _nonempty_bytes(tail):
            # The common case, a prompt new from ``first`` on: every hash in neither
            # generation, none filling the newest. Digests only, then one bulk insert.
            keys = []
            for h in tail:
                d = copy()
                d.update(h)
                keys.append(d.digest())
            new.update(zip(tail, keys, strict=True))
            out[first:] = keys
            self.num_hashed += len(keys)
            return tuple(out)  # type: ignore[arg-type]
        hashed = 0
        for i in range(first, len(out)):
            if out[i] is None:
                h = engine_hashes[i]
                key = old_get(h)
                if key is None:
                    if (h.__class__ is not bytes or not h) and \
                            (not isinstance(h, bytes | bytearray | memoryview) or not h):
                        raise ValueError(f"engine_hash must be non-empty bytes, got {h!r}")
                    d = copy()
                    d.update(h)
                    key = d.digest()
                    hashed += 1
                out[i] = new[h] = key
                if len(new) >= capacity:  # the older generation goes whole
                    self._old, new = new, {}
                    self._new = new
                    old_get = self._old.get
        self.num_hashed += hashed
        return tuple(out)  # type: ignore[arg-type]


def chain_block_keys(
    token_ids: Sequence[int],
    tokens_per_block: int,
    model: str,
    tenant_salt: str | bytes = b"",
    parent: bytes | None = None,
) -> list[BlockKey]:
    """Keys of every *full* block of ``token_ids``.

    Args:
        token_ids: the prompt's token ids (ints in ``[0, 2**63)``).
        tokens_per_block: the engine's block size (tokens).
        model: model name; part of the namespace.
        tenant_salt: per-tenant secret; part of the namespace.
        parent: key of the block just before ``token_ids[0]`` when hashing a
            continuation; ``None`` when ``token_ids`` starts the prompt.

    Returns ``len(token_ids) // tokens_per_block`` keys; key ``i`` names the prefix
    ``token_ids[: (i + 1) * tokens_per_block]`` (plus whatever ``parent`` names).
    """
    if not isinstance(tokens_per_block, int) or tokens_per_block <= 0:
        raise ValueError(f"tokens_per_block must be a positive int, got {tokens_per_block!r}")
    if parent is not None and (not isinstance(parent, bytes) or len(parent) != KEY_BYTES):
        raise ValueError(f"parent must be {KEY_BYTES} bytes or None, got {parent!r}")
    ns = namespace_key(model, tenant_salt)
    num_blocks = len(token_ids) // tokens_per_block
    pack = struct.Struct(f"<{tokens_per_block}q").pack
    prev = parent if parent is not None else bytes(KEY_BYTES)
    keys: list[bytes] = []
    for i in range(num_blocks):
        block = token_ids[i * tokens_per_block:(i + 1) * tokens_per_block]
        try:
            payload = pack(*block)
        except struct.error:
            bad = next((t for t in block
                        if not isinstance(t, int) or not 0 <= t <= _MAX_TOKEN_ID), block)
            raise ValueError(
                f"token_ids must be ints in [0, 2**63), got {bad!r} in block {i}"
            ) from None
        if min(block) < 0:
            raise ValueError(f"token_ids must be ints in [0, 2**63), got {min(block)!r} "
                             f"in block {i}")
        prev = hashlib.blake2b(prev + payload, digest_size=KEY_BYTES, key=ns).digest()
        keys.append(prev)
    return keys


def as_block_key(engine_hash: bytes | int | str) -> BlockKey:
    """Normalise an engine-supplied block hash to a 32-byte key, deterministically.

    - ``bytes`` of length 32 (vLLM's sha256 block hashes): returned unchanged.
    - ``int`` in ``[0, 2**256)``: its 32-byte big-endian encoding (so an int and the
      bytes it encodes are the same key).
    - ``str`` of 64 hex digits (SGLang-style hex digests): the 32 bytes it spells.
    - anything else (other byte lengths, negative ints, other strings): a BLAKE2b-256
      digest of a type tag and the value, so distinct inputs stay distinct keys.

    Engine hashes are trusted to carry their own model/tenant namespacing.
    """
    if isinstance(engine_hash, bytes):
        if len(engine_hash) == KEY_BYTES:
            return engine_hash
        return hashlib.blake2b(_ENGINE_TAG + b"b" + engine_hash, digest_size=KEY_BYTES).digest()
    if isinstance(engine_hash, bool):
        raise ValueError(f"engine_hash must be bytes, int or str, got {engine_hash!r}")
    if isinstance(engine_hash, int):
        if 0 <= engine_hash < (1 << (8 * KEY_BYTES)):
            return engine_hash.to_bytes(KEY_BYTES, "big")
        raw = engine_hash.to_bytes((engine_hash.bit_length() + 8) // 8 + 1, "big", signed=True)
        return hashlib.blake2b(_ENGINE_TAG + b"i" + raw, digest_size=KEY_BYTES).digest()
    if isinstance(engine_hash, str):
        if len(engine_hash) == 2 * KEY_BYTES:
            try:
                raw_hex = bytes.fromhex(engine_hash)
            except ValueError:
                raw_hex = b""
            if len(raw_hex) == KEY_BYTES:
                return raw_hex
        return hashlib.blake2b(_ENGINE_TAG + b"s" + engine_hash.encode("utf-8"),
                               digest_size=KEY_BYTES).digest()
    raise ValueError(
        f"engine_hash must be bytes, int or str, got {type(engine_hash).__name__}"
    )


def check_key(key: object, field: str = "key") -> bytes:
    """Return ``key`` if it is a valid 32-byte block key, else raise ``ValueError``."""
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        raise ValueError(f"{field} must be {KEY_BYTES} bytes, got {key!r}")
    return key


def check_keys(keys: tuple[bytes, ...], first_index: int) -> None:
    """Every key is 32 bytes and none repeats (checked in bulk; the slow scans only
    name the culprit). A repeated key would make a segment the index refuses, after its
    bytes were written, and on every later restart."""
    if not (set(map(type, keys)) <= {bytes} and set(map(len, keys)) <= {KEY_BYTES}):
        for i, k in enumerate(keys):
            check_key(k, f"keys[{first_index + i}]")
    if len(set(keys)) != len(keys):
        first: dict[bytes, int] = {}
        for i, k in enumerate(keys):
            if k in first:
                raise ValueError(f"keys[{first_index + i}] repeats keys[{first_index + first[k]}]"
                                 f": a request's block keys are a chain and never repeat")
            first[k] = i
