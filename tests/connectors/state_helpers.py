"""A tiny model with a recurrent state layer beside an attention layer, and its
engine's pages: shared by the connector's and the node service's state tests."""

from __future__ import annotations

from flatcake.connectors.group_slots import EnginePages
from flatcake.geometry import KVGeometry, LayerGroup

STATE = 200  # bytes of the state's arrays in each 512 B page
G = KVGeometry(2, 4, dtype="uint8", name="tiny-state",
               groups=(LayerGroup(1, 128), LayerGroup.state(1, [[2, 25]], ["float32"], 4)))
PAGES = (EnginePages(512), EnginePages(512, 1, 1, STATE))
SLOTS = 64
TURN0 = list(range(100, 113))  # 3 full blocks + 1 token
