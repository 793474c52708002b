"""The hooks a simulated node drives (``System``): what differs between FlatCake and its
baselines. The node (``node.py``) owns the request lifecycle and calls these."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flatcake.replay.node.node import Node
    from flatcake.replay.node.parts import Request, Worker


def not_attached(system: str) -> ValueError:
    """The error a system raises when it is driven before ``attach`` gave it a node."""
    return ValueError(f"system {system!r} is not attached to a node (call attach first)")


class System(ABC):
    """What differs between FlatCake and its baselines.

    Contract: called from the node's event loop only. ``on_arrival`` must eventually
    make the request ready through ``node.make_ready`` (at once, or when a restore ends);
    ``pop_ready`` hands the worker its next ready request; ``prefill_load`` is asked at
    prefill start of a request that did not restore (what else can be loaded, and how
    long the copy takes); ``on_complete`` stores the finished turn.
    """

    name = "system"

    def __init__(self) -> None:
        self.node: Node | None = None

    def attach(self, node: Node) -> None:
        self.node = node

    @abstractmethod
    def on_arrival(self, req: Request) -> None: ...

    @abstractmethod
    def pop_ready(self, worker: Worker) -> Request | None: ...

    def prefill_load(self, req: Request, worker: Worker) -> tuple[int, float]:
        """Blocks loaded right after the GPU prefix at prefill start, and the copy time
        (overlapped with compute). Default: nothing."""
        return 0, 0.0

    def on_prefill_start(self, req: Request) -> None:  # noqa: B027 - optional hook
        """Called once the hit is final, before compute."""

    @abstractmethod
    def on_complete(self, req: Request) -> None: ...

    def extra_metrics(self) -> dict[str, Any]:
        return {}
