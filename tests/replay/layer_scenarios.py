"""Hand-worked requests over a geometry of three layer kinds (a sliding window, full
attention, one entry per 32 tokens), shared by the layer-kind and window-rule tests."""

from __future__ import annotations

from flatcake.geometry import KVGeometry, LayerGroup
from tests.replay.helpers import ids

# Trace blocks of 16 tokens; a "c32" entry spans 32 tokens, so the replay's block is 32
# tokens. Per 32-token block and layer: sliding 8,192 B (window: 1 block), full 4,096 B
# (2 layers), c32 1,000 B. The layers that keep every block: 9,192 B.
HYBRID = KVGeometry(num_layers=4, tokens_per_block=32, dtype="uint8", name="hybrid",
                    groups=(LayerGroup(1, 256, window_tokens=32, kind="sliding"),
                            LayerGroup(2, 128, kind="full"),
                            LayerGroup(1, 1000, tokens_per_entry=32, kind="c32")))
TRACE_BT = 16

# A, B, C (11 trace blocks each: 5 whole 32-token blocks and half of one), then A and B
# come back extended, at one instant. The GPU holds 7 blocks and the host tier 5, so A
# and B come back from SSD.
REQS = [(0.0, ids(0, 11), 11 * TRACE_BT, 2), (1.0, ids(100, 111), 11 * TRACE_BT, 2),
        (2.0, ids(200, 211), 11 * TRACE_BT, 2), (10.0, ids(0, 13), 13 * TRACE_BT, 2),
        (10.0, ids(100, 113), 13 * TRACE_BT, 2)]

# A, B, C as above, then D shares A's first 3 whole blocks and goes on elsewhere: its
# hit ends inside A's SSD segment, which holds the sliding layer's last block only.
BRANCH = [*REQS[:3], (10.0, ids(0, 6) + ids(500, 505), 11 * TRACE_BT, 2)]
