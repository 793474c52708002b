"""A working-set workload: N distinct long prompts revisited with a new short question.

Like kv-cache-tester's working-set tester: the working set is ``num_prompts`` prompts of
``prompt_tokens`` each; request ``k`` sends prompt ``k mod N`` (``round_robin``) or a
seeded random one (``random``), followed by ``suffix_tokens`` tokens of its own (a
different question every visit), so a revisit can reuse the whole prompt and must
compute the suffix. Round robin over a working set larger than a cache is the classic
LRU worst case: every visit finds its prompt evicted. The stream is endless; the
driver's ``duration`` / ``max_requests`` end it.

Each prompt is one block of ``prompt_tokens`` tokens (its id names the prompt), so the
whole prompt is shared between visits and nothing is shared between prompts. Prompt i's
visits form the session ``ws-i`` (``ws-i-s<seed>`` under another token seed).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Literal

import numpy as np

from flatcake.loadgen.prompts import TokenSpace
from flatcake.loadgen.workload import Session, Turn, Workload, session_name

Order = Literal["round_robin", "random"]
ORDERS: tuple[str, ...] = ("round_robin", "random")
WS_ID_BASE = 1 << 62
"""Working-set block ids start here, far from any trace's ids."""


def working_set(*, num_prompts: int, prompt_tokens: int, suffix_tokens: int,
                max_tokens: int, tokens: TokenSpace, budget_tokens: int,
                order: Order = "round_robin", seed: int = 0) -> Workload:
    """The endless working-set workload; see the module docstring."""
    if num_prompts <= 0:
        raise ValueError(f"--working-set must be > 0 prompts, got {num_prompts}")
    if prompt_tokens <= 0:
        raise ValueError(f"--prompt-tokens must be > 0, got {prompt_tokens}")
    if suffix_tokens < 0:
        raise ValueError(f"--suffix-tokens must be >= 0, got {suffix_tokens}")
    if order not in ORDERS:
        raise ValueError(f"--order must be one of {', '.join(ORDERS)}, got {order!r}")
    if prompt_tokens + suffix_tokens > budget_tokens:
        raise ValueError(f"--prompt-tokens {prompt_tokens} + --suffix-tokens {suffix_tokens} "
                         f"exceed the context budget of {budget_tokens} tokens "
                         "(--max-model-len minus --max-tokens)")
    desc = (f"working set: {num_prompts} prompts of {prompt_tokens} tokens + "
            f"{suffix_tokens}-token questions, {order.replace('_', ' ')}")
    return Workload(description=desc, sessions=_visits(num_prompts, suffix_tokens,
                                                        max_tokens, order, seed,
                                                        tokens.seed),
                    tokens=tokens, block_tokens=prompt_tokens,
                    meta={"working_set": num_prompts, "prompt_tokens": prompt_tokens,
                          "suffix_tokens": suffix_tokens, "order": order})


def _visits(n: int, suffix_tokens: int, max_tokens: int, order: Order, seed: int,
            token_seed: int) -> Iterator[Session]:
    rng = np.random.default_rng(seed)
    for k in itertools.count():
        i = k % n if order == "round_robin" else int(rng.integers(n))
        turn = Turn(block_ids=np.array([WS_ID_BASE + i], dtype=np.int64),
                    tail_tokens=suffix_tokens, tail_key=k, max_tokens=max_tokens)
        yield Session(name=session_name(f"ws-{i}", token_seed), turns=(turn,))
