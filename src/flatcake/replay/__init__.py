"""The replay: FlatCake's real books and plans, and its baselines, on a simulated clock
over modelled devices (no I/O). Floors, each importing only those below it:

* ``workload``: the trace in replay form and where it comes from;
* ``node``: the simulated node (clock, devices, workers, occupancy, metrics);
* ``systems``: the stores a replay compares, one registry naming them all;
* ``presets``, ``calibration``: the settings of a run;
* ``simulate`` (one run), ``cluster`` (many nodes), ``results`` and ``sweep`` (a grid of
  runs, written as tables, ``plots`` and a ``page``).
"""
