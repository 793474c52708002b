"""FC-GVA: keys, 64-bit addresses, the block index, placement, allocation, reclaim."""

from flatcake.gva.address import Address, Medium, decode_address, encode_address
from flatcake.gva.alloc import HostArena, SessionFile, SsdExtent, SsdSpace
from flatcake.gva.index import (
    EMPTY_HIT,
    BlockIndex,
    BlockLocation,
    HitRun,
    PrefixHit,
    Segment,
)
from flatcake.gva.keys import (
    BlockKey,
    as_block_key,
    chain_block_keys,
    engine_block_key,
    namespace_key,
)
from flatcake.gva.placement import (
    Placement,
    PlacementRule,
    PlacementSignals,
    decide_placement,
    explain,
)
from flatcake.gva.reclaim import SessionUsage, choose_victims
from flatcake.gva.sessions import SessionRecord

__all__ = [
    "EMPTY_HIT",
    "Address",
    "BlockIndex",
    "BlockKey",
    "BlockLocation",
    "HitRun",
    "HostArena",
    "Medium",
    "Placement",
    "PlacementRule",
    "PlacementSignals",
    "PrefixHit",
    "Segment",
    "SessionFile",
    "SessionRecord",
    "SessionUsage",
    "SsdExtent",
    "SsdSpace",
    "as_block_key",
    "chain_block_keys",
    "choose_victims",
    "decide_placement",
    "decode_address",
    "encode_address",
    "engine_block_key",
    "explain",
    "namespace_key",
]
