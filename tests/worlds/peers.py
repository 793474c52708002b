"""The other node of a two-node cluster, for the store and connector worlds, without
Redis or NIXL: the cluster index answers straight from the owner's books
(``PeerIndex``: what ``cluster.ClusterIndex.lookup`` answers once the owner published
its durable segments), the transport hands over the owner's bytes straight from its
session files and arena (``PeerReader``: a ``cio.remote_load.RemoteReader``, what the
NIXL readers of ``cio.remote_readers`` deliver), and ``StoreClusterDouble`` is the part
of ``store.cluster.StoreCluster`` a ``FlatCakeStore`` uses (publishing is the index's
business here, so it publishes nothing). The requester's side is real: its lookup
(``plan.remote.remote_runs``, ``connectors.cluster_side``), the remote part of its load
(``cio.remote_load``: crc32 of every layer against the owner's record, then scatter)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flatcake.cio.crc import crc32
from flatcake.cio.filescan import scan_session_file
from flatcake.cio.format import session_file_name
from flatcake.cio.remote_load import Consume
from flatcake.control import ControlPlane
from flatcake.control.address import Address, Medium
from flatcake.control.index import Segment
from flatcake.plan.remote import RemoteRun, remote_runs, segment_record

ArenaBytes = Callable[[int, int], np.ndarray]  # (offset, length) -> the owner's arena bytes


@dataclass(frozen=True, slots=True)
class Hit:
    """One key's entry in the cluster index (``cluster.RemoteHit``'s fields)."""

    node: int
    segment_id: int
    position: int
    record: dict[str, Any]


@dataclass(frozen=True)
class Owner:
    """What the cluster knows of a node: its books, session files and arena."""

    node: int
    control: ControlPlane
    sessions_dir: Path
    arena: ArenaBytes

    def crcs(self, seg: Segment) -> tuple[int, ...]:
        """crc32 of each layer of a durable segment (an SSD one's from its header)."""
        lay = seg.layout
        if seg.medium == Medium.SSD:
            path = self.sessions_dir / session_file_name(int(seg.file_id or 0))
            _, found, _ = scan_session_file(path, verify_data=False)
            return next(s.header.layer_crcs for s in found
                        if s.file_offset == int(seg.file_offset or 0))
        data = self.arena(Address.decode(seg.base_address).offset, lay.data_bytes)
        return tuple(crc32(data[lay.layer_offset(i):lay.layer_offset(i) + lay.layer_bytes(i)]
                           .tobytes()) for i in range(lay.num_layers))


class PeerIndex:
    """The cluster index as one node sees it: the other node's published blocks."""

    failures = 0

    def __init__(self, owner: Owner) -> None:
        self.owner = owner

    def lookup(self, keys: Sequence[bytes], *, prefix: bool = True) -> list[Hit]:
        hits = []
        for key in keys:
            loc = self.owner.control.locate(key)
            if loc is None:
                break
            seg = loc.segment
            where = session_file_name(int(seg.file_id)) if seg.file_id is not None else ""
            hits.append(Hit(self.owner.node, seg.segment_id, loc.position,
                            segment_record(seg, self.owner.crcs(seg), where)))
        return hits

    def close(self) -> None:
        pass


class PeerReader:
    """Whole segment layers of the owner's file or arena, handed to ``consume``."""

    window_bytes = 1 << 30

    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.bytes_read = 0

    def read_layers(self, run: RemoteRun, layers: range, consume: Consume) -> bool:
        lay = run.layout
        for layer in layers:
            if run.medium == Medium.SSD:
                with open(self.owner.sessions_dir / run.location, "rb") as f:
                    f.seek(run.file_offset + lay.layer_offset(layer))
                    data = np.frombuffer(bytearray(f.read(lay.layer_bytes(layer))), np.uint8)
            else:
                base = Address.decode(run.address).offset + lay.layer_offset(layer)
                data = self.owner.arena(base, lay.layer_bytes(layer)).copy()
            self.bytes_read += data.nbytes
            if not consume(layer, data):
                return False
        return True

    def close(self) -> None:
        pass


class StoreClusterDouble:
    """What ``FlatCakeStore`` asks of its ``StoreCluster``: the runs other nodes hold
    after the local prefix (``remote``); publishing and removal are no-ops."""

    def __init__(self, index: PeerIndex) -> None:
        self.index = index

    def remote(self, keys: Sequence[bytes], start: int,
               layer_block_bytes: tuple[int, ...]) -> tuple[RemoteRun, ...]:
        if start >= len(keys):
            return ()
        return remote_runs(self.index.lookup(keys[start:]), start, layer_block_bytes)

    def segment_crcs(self, seg: Segment) -> None:
        return None  # nothing to publish: the index reads the books

    def publish(self, segments: Any) -> None:
        pass

    def dropped(self, actions: Any) -> None:
        pass

    def close(self) -> None:
        pass
