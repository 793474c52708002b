"""What an engine's scheduler calls FlatCake through, and what a host of the request
driver provides (engine-neutral, no torch).

``SchedulerHalf`` is the contract both scheduler halves keep: ``SchedulerSide`` (the
books in the engine's process) and ``RemoteSchedulerSide`` (the same calls answered by
the node service, which runs a ``SchedulerSide`` per engine). An engine's connector
holds one of them and never asks which: a new engine host is one adapter file that
turns the engine's requests into ``RequestView`` values and its steps into these calls,
plus its tests and docs.

Every call comes from one thread, the engine's scheduler, in this order per request::

    new_request ─► num_matched_tokens (again while it answers None: a store of the
                   prefix is in flight) ─► after_alloc (the admitted hit's slots)
      ─► build_step (each step: the loads, stores and file work for the workers)
      ─► on_report + take_released (each step: what the workers reported, the
                   restores the engine may schedule now)
      ─► request_finished (the reply's length; whether to keep the blocks)

A request's restore moves through the request driver's phases (``plan.driver``):
admitted at the lookup, queued at ``after_alloc``, started with ``build_step``,
reported and released with ``on_report``/``take_released``. What the host provides to
the driver: the books and their FC-MAS queue (``queue``: the engine's own in a node
service), the number of workers that report every load, a clock (the books'), and the
lock that serialises the calls (here the scheduler thread itself; the store's own lock
in ``FlatCakeStore``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from flatcake.connectors.requests import BlockEvent, RequestView
from flatcake.control import StorePlan
from flatcake.plan.tasks import StepPlan, WorkerReport

__all__ = ["SchedulerHalf"]


class SchedulerHalf(Protocol):
    """The scheduler half of a connector (module docstring); one engine scheduler
    thread calls it."""

    @property
    def recovered_segments(self) -> int:
        """Segments the books re-indexed at start (the node's, attached)."""
        ...

    @property
    def ssd_in_step(self) -> bool:
        """An SSD load runs in the step that schedules its request."""
        ...

    def new_request(self, req: RequestView) -> None:
        """A request entered the engine."""
        ...

    def num_matched_tokens(self, req: RequestView, num_local_tokens: int
                           ) -> tuple[int | None, bool]:
        """Tokens FlatCake can load past the engine's ``num_local_tokens``, and whether
        the load is async; ``(None, False)``: ask again next step."""
        ...

    def after_alloc(self, request_id: str, block_ids: Sequence[int],
                    num_external_tokens: int) -> None:
        """The engine admitted the hit into ``block_ids``: plan its load."""
        ...

    def hit_sources(self, request_id: str) -> tuple[int, int]:
        """Tokens of the admitted hit in memory and on SSD."""
        ...

    def prompt_computed(self, req: RequestView, block_ids: Sequence[int]
                        ) -> StorePlan | None:
        """The step computing the rest of the prompt is scheduled: plan its store."""
        ...

    def build_step(self, preempted: Sequence[str] = (),
                   computed: Sequence[tuple[RequestView, Sequence[int]]] = ()) -> StepPlan:
        """This step's loads, stores and file work for the workers."""
        ...

    def on_report(self, report: WorkerReport) -> None:
        """What the workers reported in this step."""
        ...

    def take_released(self, reported: Iterable[str]) -> list[str]:
        """The restores the engine may schedule now, in FC-MAS's order."""
        ...

    def request_finished(self, req: RequestView) -> tuple[bool, dict[str, Any] | None]:
        """The request finished: whether to keep its blocks, its ``kv_transfer_params``."""
        ...

    def has_pending_stores(self) -> bool:
        """Stores planned and not yet reported: the engine must keep stepping."""
        ...

    def num_pending_stores(self) -> int:
        """Stores planned and not yet reported by every worker."""
        ...

    def take_events(self) -> list[BlockEvent]:
        """Blocks published and dropped since the last call, in order."""
        ...

    def take_stats(self) -> dict[str, int | float]:
        """Counters since the last call, plus the gauges of now."""
        ...

    def close(self) -> None:
        """Let go of what the half holds (the cluster index, the node service)."""
        ...
