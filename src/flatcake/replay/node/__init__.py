"""The simulated serving node: the event clock, the device models, the workers and
their request lifecycle, occupancy and the metrics a run records. Stands on
``replay.workload`` only; the systems (``replay.systems``) plug into it."""
