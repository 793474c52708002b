"""Token ids of load-generator prompts: each block id becomes a fixed run of token ids.

A trace names its prompts by chained block ids, and the reuse between two requests is
exactly the ids they share. Here a block's tokens are a pure function of (seed, block
id, position in the block), so two prompts that share ids share exactly those tokens and
none other (up to a 2**-64 collision of the hash), nothing is kept between requests and
no tokenizer is needed: the server gets token ids (``prompt`` as a list of ints)::

    prompt = tokens(id_0) + tokens(id_1) + ... + tokens(id_k-1) + tail(key)
             |<-- block_tokens -->|                              |<- tail_tokens ->|

The tail is a request's own tokens (a trace's partial last block, the working set's
question): drawn from a second stream keyed by the request, so it is never shared.
Token ids lie in ``[MIN_TOKEN_ID, vocab_size)``: the ids below are ``<unk>``, ``<s>``
and ``</s>`` in Llama-style vocabularies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_TOKEN_ID = 3
_BLOCK_STREAM = 0x9E3779B97F4A7C15
_TAIL_STREAM = 0xD1B54A32D192ED03
_MASK = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 (wraps modulo 2**64 by design)."""
    x = x.copy()
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


@dataclass(frozen=True, slots=True)
class TokenSpace:
    """Where prompt tokens come from.

    Attributes:
        vocab_size: the model's vocabulary; ids are drawn from
            ``[MIN_TOKEN_ID, vocab_size)``.
        seed: a different seed gives different tokens for the same ids (a cold run
            against a server that still holds an earlier run's prefixes).
    """

    vocab_size: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.vocab_size <= MIN_TOKEN_ID + 1:
            raise ValueError(f"vocab_size must be > {MIN_TOKEN_ID + 1}, got {self.vocab_size}")

    def _draw(self, stream: int, keys: np.ndarray, n: int) -> np.ndarray:
        """``(len(keys), n)`` token ids, row ``r`` a function of (seed, stream, keys[r])."""
        salt = np.uint64(((self.seed * 0x2545F4914F6CDD1D) ^ stream) & _MASK)
        with np.errstate(over="ignore"):
            base = _mix(keys.astype(np.uint64) ^ salt)
            pos = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(_BLOCK_STREAM)
            h = _mix(base[:, None] + pos[None, :])
        span = np.uint64(self.vocab_size - MIN_TOKEN_ID)
        return (h % span).astype(np.int64) + MIN_TOKEN_ID

    def block_tokens(self, block_ids: Sequence[int] | np.ndarray,
                     block_tokens: int) -> np.ndarray:
        """Tokens of each block, int64 ``(len(block_ids), block_tokens)``."""
        if block_tokens <= 0:
            raise ValueError(f"block_tokens must be > 0, got {block_tokens}")
        ids = np.asarray(block_ids, dtype=np.int64)
        return self._draw(_BLOCK_STREAM, ids, block_tokens)

    def tail_tokens(self, key: int, n: int) -> np.ndarray:
        """``n`` tokens that belong to request ``key`` alone, int64 ``(n,)``."""
        if n <= 0:
            return np.zeros(0, dtype=np.int64)
        return self._draw(_TAIL_STREAM, np.array([key & _MASK], dtype=np.uint64), n)[0]

    def prompt(self, block_ids: Sequence[int] | np.ndarray, block_tokens: int,
               tail_key: int, tail_tokens: int) -> list[int]:
        """The prompt's token ids: its blocks' runs, then its own tail."""
        blocks = self.block_tokens(block_ids, block_tokens).reshape(-1)
        return np.concatenate([blocks, self.tail_tokens(tail_key, tail_tokens)]).tolist()
