"""An engine's scheduler half's verbs on the node service's wire, with their declared
types (``link.verbs`` has the others and the ``Verb`` they are): each forwards to the
engine's ``SchedulerSide`` in the service (``connectors.node_client`` calls them).
``step`` and ``update`` answer a hook's result with whether work is left and the block
events since the last call, so a vLLM hook is one round trip; a step carries the
stores it plans, and the requests that entered or finished since the last call ride
with the next, as do the hits admitted since (``after_alloc``: with the next lookup or
step; its answer, the hit's sources, is the lookup's). An update answers the
``kv_transfer_params`` of the requests whose loads its report ended, so the engine half
answers their ``request_finished`` itself."""

from __future__ import annotations

from typing import Any

from flatcake.config import FlatCakeConfig
from flatcake.connectors.requests import BlockEvent, RequestView
from flatcake.control import StorePlan
from flatcake.geometry import KVGeometry
from flatcake.link.verbs import Verb, table
from flatcake.link.wire import Attached, TensorRanks
from flatcake.plan.tasks import StepPlan, WorkerReport

_REQ = ("req", RequestView)
# ``async_loads``: every load of the engine is async (``SchedulerSide.async_loads``: an
# engine of several KV cache groups learns a failed load only by request).
ATTACH = Verb("attach", Attached, ("name", str), ("pid", int), ("geometry", KVGeometry),
              ("ranks", TensorRanks), ("config", FlatCakeConfig), ("async_loads", bool, False))
# ``new``: requests that entered the engine since its last call, each a ``new_request``
# run first; ``done``: requests that finished since, each a ``request_finished`` run
# next (their answers were the engine half's own: ``RemoteSchedulerSide``).
_NEW = ("new", tuple[RequestView, ...], ())
_DONE = ("done", tuple[RequestView, ...], ())
# One ``after_alloc``: the request, its block ids, its external tokens.
ADMISSION = tuple[str, list[int], int]
# ``admitted``: the hits admitted since the engine's last call, each an ``after_alloc``
# run after ``new`` and ``done``, before what the call asks; the call answers the
# requests among them whose load was not planned (the engine recomputes them).
_ADMITTED = ("admitted", tuple[ADMISSION, ...], ())
PARAMS = dict[str, Any]
# A lookup's answer: tokens, async, the request's ``kv_transfer_params`` so far, its
# hit's tokens in memory and on SSD (``hit_sources`` once admitted), the admissions
# refused, and whether the books hold its whole prompt (``SchedulerSide.held_whole``:
# the step computing it leaves it out).
LOOKUP = tuple[int | None, bool, PARAMS | None, tuple[int, int], list[str], bool]
ENGINE = table(
    Verb("new_request", None, _REQ),
    # ``entered``: so did ``req`` (its keys sent once). One round trip for a new
    # request's two hooks.
    Verb("num_matched_tokens", LOOKUP, _REQ, ("num_local_tokens", int),
         ("entered", bool, False), _NEW, _DONE, _ADMITTED),
    Verb("after_alloc", tuple[int, int], ("request_id", str), ("block_ids", list[int]),
         ("num_external_tokens", int)),
    Verb("prompt_computed", StorePlan | None, _REQ, ("block_ids", list[int])),
    # ``computed``: the requests whose prompt the step computes (``prompt_computed``
    # each, then the step: its plan holds their stores).
    Verb("step", tuple[StepPlan, bool, list[BlockEvent], list[str]],
         ("preempted", tuple[str, ...]),
         ("computed", tuple[tuple[RequestView, list[int]], ...], ()), _DONE, _ADMITTED),
    # Its last answer: the params of the requests whose load the report ended (every
    # worker reported it).
    Verb("update", tuple[list[str], bool, list[BlockEvent], dict[str, PARAMS]],
         ("report", WorkerReport | None), ("finished", list[str]), _DONE),
    Verb("request_finished", tuple[bool, dict[str, Any] | None], _REQ),
    Verb("take_stats", dict[str, int | float]),
)
