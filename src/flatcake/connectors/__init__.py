"""FlatCake behind an engine: the vLLM KV connector (``vllm``) and its engine-neutral
halves, the scheduler half (the books, ``scheduler_side``) and the worker half (the
executor, ``worker_side``), with their extra config (``settings``) and counters
(sessions and placement signals are the books': ``flatcake.control.signals``).

Names resolve on first use (PEP 562), kept lazy for the optional engines: importing
the package loads neither vLLM, SGLang nor torch; ``FlatCakeConnector`` and ``flush``
load vLLM when first asked for, ``WorkerSide`` torch.
"""

from __future__ import annotations

from flatcake.lazy import lazy_getattr

_WHERE = {
    "BlockEvent": "requests",
    "COUNTER_KEYS": "requests",
    "RequestView": "requests",
    "SchedulerSide": "scheduler_side",
    "parse_extra_config": "settings",
    "FlatCakeConnector": "vllm",
    "flush": "vllm_glue",
    "WorkerSide": "worker_side",
}

__all__ = sorted(_WHERE)


__getattr__ = lazy_getattr(__name__, _WHERE)
