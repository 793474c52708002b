"""One FlatCake per machine: the node service (``flatcake serve``) and its clients.

::

    engine A (vLLM DP rank / instance)      engine B               flatcake serve
    scheduler half ── RemoteSchedulerSide ──┐                     ┌─ NodeService ───────────┐
                                            ├─ unix socket ─────►│ books: one ControlPlane │
    scheduler half ── RemoteSchedulerSide ──┘  one call per hook  │ per engine: its half    │
                                                                  │ (SchedulerSide) and its │
    worker (TP rank r) ─┐  StepPlan (as embedded)                 │ FC-MAS queue; leases    │
    worker (TP rank r) ─┴─ Executor, attached: ROOT/tp<r>/ files  │ LOCK of every rank root │
                           (O_DIRECT, zero-copy as today) and the └─────────────────────────┘
                           shared arena (/dev/shm, MAP_SHARED)

The service holds the books and never a KV byte: workers read and write the shared
session files and the shared arena exactly as an embedded worker does (the same
``StepPlan`` tasks, the same executor). ``server`` is the service (``endpoint``: its
socket and loop; ``arena``: each part's files); the wire and the clients' side are
``flatcake.link`` (the vLLM scheduler half attached: ``connectors.node_client``).
The service hosts the connectors' engine-neutral scheduler
halves, one per engine, and the books of attached ``FlatCakeStore``s (the SGLang backend
among them).
"""
