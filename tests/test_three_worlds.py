"""One scenario, three worlds: the same scripted multi-session workload goes through

1. the replay's FlatCake (``replay.systems.flatcake`` reading the other node's blocks
   through ``sharing.FlatCakeReads``, on two simulated nodes: devices modelled, no I/O),
2. ``FlatCakeStore`` (one store per node, real bytes in a temporary directory), and
3. the vLLM connector's two halves without an engine (``SchedulerSide`` on the books,
   ``WorkerSide`` moving real bytes; one pair per node),

and the three must decide the same. The script (``tests/worlds/scenario.py``) has five
phases, one global clock (sessions are inferred from the books in every world):

* two-worlds: three conversations share a system prompt; short and long replies put
  turns in memory and on SSD; a small SSD makes the books reclaim the oldest one;
* fc-mas: four SSD restores at once with one restore slot: the first takes it, the
  other three start by FC-MAS priority ``1 + wait / kv_bytes``, smallest first;
* damage: a segment rots on disk between turns; a branch of its session reads it;
* header-damage: likewise, and the file's header rots too;
* remote: a conversation's first turn runs on node 1; its next turn, on node 0, hits
  the system prompt there and the rest on node 1, a restore with a remote part queued
  for the slot next to a local one whose size lies between the local part alone and
  the whole restore.

The replay runs first and logs when each request arrived, had its restore done and
finished; the store and the connector follow that log at the replay's times (their
clocks are set to them, and a restore is handed back only when the replay's was done),
so FC-MAS decides with the same queue at the same moments in all three. Compared, per
phase: placements (session, medium, rule) and blocks stored per turn, the hit each
request was served (blocks, memory, SSD, remote), SSD read commands and bytes, FC-MAS
weights and start order, the bytes other nodes sent, and after the rot the session's
segments left in the books (and, store against connector, its files on disk).

What a world cannot do: the replay does no I/O, so a rot is the books verb the hosts
call when a checksum fails (``ControlPlane.mark_damaged``), just before the reader
arrives; the store and the connector learn of it by reading the segment, so the reads
and FC-MAS weight of the reader itself are not compared. Another node is reached
without Redis and NIXL in the store and connector worlds (``tests/worlds/peers.py``:
an index double answering from the owner's books, a reader double reading its files).

Two geometries: a block of one layer of exactly 4 KiB, and one of 1.25 x 4 KiB, so
every read command carries O_DIRECT alignment padding, which the bytes read must count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from flatcake.geometry import KVGeometry
from tests.replay.helpers import GEOMETRY
from tests.worlds.replay import ReplayWorld, preset, run_replay
from tests.worlds.scenario import PADDED, PHASES, Record, Script, script
from tests.worlds.sides import SidesWorld
from tests.worlds.store import StoreWorld


@dataclass(frozen=True)
class Worlds:
    script: Script
    replay: ReplayWorld
    store: Record
    connector: Record

    def records(self) -> dict[str, Record]:
        return {"replay": self.replay.rec, "store": self.store, "connector": self.connector}

    def by_name(self, rec: Record, field: str, keep: set[int]) -> dict[str, Any]:
        return {self.script.steps[i].name: v for i, v in getattr(rec, field).items()
                if i in keep}


@pytest.fixture(scope="module", params=[GEOMETRY, PADDED], ids=lambda g: g.name)
def worlds(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Worlds:
    g: KVGeometry = request.param
    s = script()
    replay = run_replay(s, g)
    config = preset(g).flatcake_config()
    store = StoreWorld(s, g, tmp_path_factory.mktemp("store"), config).run(replay.events)
    sides = SidesWorld(s, g, tmp_path_factory.mktemp("sides"), config).run(replay.events)
    return Worlds(s, replay, store, sides)


def assert_same(w: Worlds, field: str, keep: set[int]) -> None:
    """Every world recorded the same ``field`` for the requests ``keep``; else the
    message names each request where one differs, with every world's value."""
    seen = {name: w.by_name(rec, field, keep) for name, rec in w.records().items()}
    requests = sorted(set().union(*seen.values()), key=w.script.index)
    differ = {r: {name: got.get(r) for name, got in seen.items()} for r in requests
              if len({repr(got.get(r)) for got in seen.values()}) > 1}
    assert not differ, f"{field} differ: {differ}"


@pytest.mark.parametrize("phase", PHASES)
def test_same_placements(worlds: Worlds, phase: str) -> None:
    """Per turn: the session it was stored in, the medium and the rule."""
    assert_same(worlds, "placed", worlds.script.phase(phase))


@pytest.mark.parametrize("phase", PHASES)
def test_same_blocks_stored(worlds: Worlds, phase: str) -> None:
    assert_same(worlds, "stored_blocks", worlds.script.phase(phase))


@pytest.mark.parametrize("phase", PHASES)
def test_same_hits(worlds: Worlds, phase: str) -> None:
    """Per request, the hit it was served: blocks, of them in this node's memory and
    SSD, and sent by another node (after a rot: what was served, the rest recomputed)."""
    assert_same(worlds, "hits", worlds.script.phase(phase))


@pytest.mark.parametrize("phase", PHASES)
def test_same_ssd_reads(worlds: Worlds, phase: str) -> None:
    """This node's SSD read commands and bytes, per restore (whole segments, for their
    checksums; alignment padding included)."""
    assert_same(worlds, "reads", worlds.script.phase(phase) - worlds.script.readers_of_rot())


@pytest.mark.parametrize("phase", PHASES)
def test_same_fc_mas_weights(worlds: Worlds, phase: str) -> None:
    """The ``kv_bytes`` FC-MAS weighs each restore that waits for a slot with."""
    assert_same(worlds, "weights",
                worlds.script.phase(phase) - worlds.script.readers_of_rot())


@pytest.mark.parametrize("phase", PHASES)
def test_same_fc_mas_start_order(worlds: Worlds, phase: str) -> None:
    """The order FC-MAS started the restores that waited for a slot."""
    keep = worlds.script.phase(phase)
    order = {name: worlds.script.names([i for i in rec.started if i in keep])
             for name, rec in worlds.records().items()}
    assert order["store"] == order["replay"] and order["connector"] == order["replay"], \
        f"start orders differ: {order}"


def test_same_remote_bytes(worlds: Worlds) -> None:
    """Bytes other nodes sent, per restore with a remote part."""
    assert_same(worlds, "remote_bytes", set(range(len(worlds.script.steps))))


@pytest.mark.parametrize("victim", ["h1", "k1"])
def test_same_damage_outcome(worlds: Worlds, victim: str) -> None:
    """Once the request that read the rotted segment has stored its turn, the victim's
    session keeps the same segments in the books of every world (cut before the rot,
    or dropped where its file header rotted too)."""
    after = {name: rec.after_rot[victim] for name, rec in worlds.records().items()}
    assert after["store"] == after["replay"] and after["connector"] == after["replay"], \
        f"segments of the session of {victim} left: {after}"


@pytest.mark.parametrize("victim", ["h1", "k1"])
def test_store_and_connector_leave_the_same_files(worlds: Worlds, victim: str) -> None:
    """The victim's file: its size (cut after the last good segment; -1: gone) and the
    files in quarantine/."""
    assert worlds.connector.on_disk[victim] == worlds.store.on_disk[victim]


def test_the_script_covers_what_it_compares(worlds: Worlds) -> None:
    s, rec = worlds.script, worlds.replay.rec
    name = s.index
    base = s.phase("two-worlds")
    placed = [p for i, p in rec.placed.items() if i in base and p is not None]
    assert {medium for _, medium, _ in placed} == {"MEMORY", "SSD"}
    assert worlds.replay.nodes[0].num_reclaim_actions > 0
    assert rec.hits[name("b0")][0] == 3  # the shared system prompt
    # Three restores waited for the one slot and started smallest first.
    assert s.names([i for i in rec.started if i in s.phase("fc-mas")]) == \
        ["d1", "g1", "f1", "e1"]
    # Each rotted segment follows an earlier SSD segment of its session in one file.
    for turn, victim in [("h0", "h1"), ("k0", "k1")]:
        at = rec.placed[name(victim)]
        assert at is not None and at[1] == "SSD"
        assert rec.file_of[name(turn)] == rec.file_of[name(victim)]
        assert worlds.store.hits[name(victim[0] + "x")][0] > 0  # an earlier turn served
    # r0 ran on node 1; r1's hit is partly here, partly there.
    assert s.steps[name("r0")].node == 1
    blocks, _, _, remote = rec.hits[name("r1")]
    assert 0 < remote < blocks


@pytest.mark.parametrize("phase", PHASES)
def test_replay_accounts_for_every_byte_read(worlds: Worlds, phase: str) -> None:
    """Every SSD byte a restore reads (here and, for its remote part, on the owner) is
    wanted, another block of a segment read for its checksum, or a gap byte (alignment
    padding, a hole read through); with 5 KiB blocks the padding is read."""
    rec = worlds.replay.rec
    keep = worlds.script.phase(phase)
    off = {worlds.script.steps[i].name: {"read": read, "wanted + checksum + gap":
                                         useful + check + gap}
           for i, (read, useful, check, gap) in rec.accounted.items()
           if i in keep and read != useful + check + gap}
    assert not off, f"bytes read but not accounted for: {off}"
    node = worlds.replay.nodes[0].node
    assert node.rec.ssd_read_bytes % 4096 == 0
    if node.geometry.block_bytes_per_layer % 4096:
        assert sum(n.read_gap_bytes for n in worlds.replay.nodes) > 0
