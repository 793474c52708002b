"""What the load generator sends: sessions of turns, each turn a prompt named by block ids.

A :class:`Workload` is an iterator of :class:`Session` values (finite for a trace, endless
for a working set) plus how to turn block ids into token ids. The driver sends a
session's turns in order, each after the previous turn's reply; a session's ``name`` is
the ``session_id`` the client may pass to the server. Builders: ``trace_workload`` (a
trace file or the built-in generator, ``loadgen.traces``) and ``working_set``
(``loadgen.working_set``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from flatcake.loadgen.prompts import TokenSpace


def session_name(name: str, seed: int) -> str:
    """``name`` under token seed ``seed``: another seed sends other tokens, so its
    sessions get other ids (``NAME-s<seed>``; seed 0 keeps the name)."""
    return name if seed == 0 else f"{name}-s{seed}"


@dataclass(frozen=True, slots=True, eq=False)
class Turn:
    """One request of a session.

    Attributes:
        block_ids: int64 chained block ids of the prompt's shared part, in order.
        tail_tokens: tokens after the blocks that belong to this request alone.
        tail_key: names those tokens (unique per request of a workload).
        max_tokens: output tokens asked for.
    """

    block_ids: np.ndarray
    tail_tokens: int
    tail_key: int
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Session:
    """A conversation: its ``name`` and its turns in order.

    ``agents`` (empty: all 0) gives each turn's agent: 0 for the main agent, ``k`` for
    the session's k-th sub-agent, whose turns run in the parent's flow (the parent
    waits for them) under their own session id.
    """

    name: str
    turns: tuple[Turn, ...]
    agents: tuple[int, ...] = ()

    def session_id(self, k: int) -> str:
        """The ``session_id`` of turn ``k``."""
        agent = self.agents[k] if self.agents else 0
        return self.name if agent == 0 else f"{self.name}/agent-{agent}"


@dataclass(slots=True)
class Workload:
    """Sessions to send and how to build their prompts.

    Attributes:
        description: one line for the summary (source, sizes, how contexts were fitted).
        sessions: the sessions in the order they are started.
        tokens: the token space prompts are drawn from.
        block_tokens: tokens per block id.
        num_requests: requests in all sessions (None: endless).
        num_cut: requests whose prompt was cut to fit the context budget.
    """

    description: str
    sessions: Iterator[Session]
    tokens: TokenSpace
    block_tokens: int
    num_requests: int | None = None
    num_cut: int = 0
    meta: dict[str, object] = field(default_factory=dict)

    def prompt(self, turn: Turn) -> list[int]:
        """The token ids of ``turn``'s prompt."""
        return self.tokens.prompt(turn.block_ids, self.block_tokens, turn.tail_key,
                                  turn.tail_tokens)

    def prompt_tokens(self, turn: Turn) -> int:
        return len(turn.block_ids) * self.block_tokens + turn.tail_tokens
