"""The three worlds of ``tests/test_three_worlds.py``: one scripted workload
(``scenario``) driven through the replay's FlatCake (``replay``), ``FlatCakeStore``
(``store``) and the vLLM connector's two halves (``sides``), each filling a
``scenario.Record``; ``kv`` holds the bytes the last two move, ``peers`` stands for the
other node of their two-node cluster."""
