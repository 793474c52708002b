"""The replay's input: a trace in replay form (per-request columns, blocks as runs of
dense ids), where it comes from (a trace file or the built-in generator) and the
shared array types. The bottom floor of ``replay``: it imports nothing else of it."""
