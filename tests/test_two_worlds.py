"""One scenario, two worlds: the same multi-session workload through ``FlatCakeStore``
(real bytes in a temporary directory) and through the replay's FlatCake system (devices
modelled) must make the same decisions: the same placement (medium and rule) for every
turn, the same hit for every request, the same SSD read commands and bytes.

The workload is global-clock, so both worlds infer sessions with ``control.signals``:
three conversations share a system prompt (a later one's first hit ends inside the first
conversation's first segment, so the whole segment is read for its checksum), replies
short and long put turns in memory and on SSD, and a small SSD makes the store reclaim
the oldest conversation (its next turn misses). Requests are far apart, so each one
finishes before the next arrives; the replay's GPU keeps no prefix between requests
(the store world has no GPU cache), so both worlds restore every hit whole.

Two geometries: one whose block of one layer is exactly 4 KiB, and one whose block is
1.25 x 4 KiB, so every read command carries O_DIRECT alignment padding (as the paper
preset's DeepSeek-V4-Flash geometry does): the bytes read must agree with it too.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from flatcake.clock import ManualClock
from flatcake.config import ReclaimConfig
from flatcake.control.signals import PrefixRefcount, SessionTracker, hit_owner
from flatcake.geometry import KVGeometry
from flatcake.replay.engine import Node, Request
from flatcake.replay.systems.flatcake import FlatCakeSystem, keys_of, make_keys
from flatcake.replay.workload import Workload, from_requests
from flatcake.store import FlatCakeStore, TurnSignals
from tests.replay.helpers import GEOMETRY, ids, tiny_preset

BT = GEOMETRY.tokens_per_block
# 16 tokens x (K+V) x 1 head x 80 dims x 2 bytes = 5 KiB per block per layer.
PADDED = KVGeometry(num_layers=4, tokens_per_block=BT, num_kv_heads=1, head_dim=80,
                    name="tiny-padded")
SYSTEM = ids(0, 3)  # the shared system prompt
SHORT, LONG = 20, 40 * BT  # replies under / over the short-reply threshold (512 tokens)


def _conversation(start: int, first: int, turns: list[tuple[int, int]]) -> list[tuple[
        int, list[int], int, int]]:
    """``(turn, block ids, input tokens, output tokens)`` of one conversation: each turn
    re-sends the history, the previous reply and ``new`` more blocks."""
    out = []
    history = [*SYSTEM]
    next_id = first
    for turn, (new, reply) in enumerate(turns):
        history += list(range(next_id, next_id + new))
        next_id += new
        out.append((start + turn, list(history), len(history) * BT, reply))
        history += list(range(next_id, next_id + -(-reply // BT)))
        next_id += -(-reply // BT)
    return out


def _workload() -> Workload:
    a = _conversation(0, 100, [(4, SHORT), (2, LONG), (3, SHORT), (2, SHORT)])
    b = _conversation(1, 1000, [(2, LONG), (5, SHORT), (2, SHORT)])
    c = _conversation(2, 2000, [(6, SHORT), (1, SHORT), (4, LONG), (2, SHORT)])
    slots = {0: a, 1: b, 2: c}
    # Interleave the conversations turn by turn, 10 s apart.
    order = sorted(((turn, k) for k, conv in slots.items() for turn in range(len(conv))))
    reqs = [(10.0 * i, slots[k][turn][1], slots[k][turn][2], slots[k][turn][3])
            for i, (turn, k) in enumerate(order)]
    return from_requests(reqs, BT, name="two-worlds")


def _preset(geometry: KVGeometry) -> Any:
    preset = tiny_preset(gpu_blocks=200, host_blocks=40, ssd_blocks=150, geometry=geometry)
    fc = preset.flatcake
    fc = dataclasses.replace(
        fc, store=dataclasses.replace(fc.store, session_file_bytes=1 << 20),
        reclaim=ReclaimConfig(ssd_high=0.9, ssd_low=0.5, memory_high=0.9, memory_low=0.5))
    return dataclasses.replace(preset, flatcake=fc)


class _Recorded(FlatCakeSystem):
    """The replay's FlatCake system, recording per request what it decided."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hits: dict[int, int] = {}
        self.reads: dict[int, tuple[int, int]] = {}
        self.placed: dict[int, tuple[str, str, str] | None] = {}
        self.load_done_s: dict[int, float] = {}
        self.complete_s: dict[int, float] = {}
        self._storing = -1

    def attach(self, node: Node) -> None:
        super().attach(node)
        cp = self.cp
        assert cp is not None
        prepare_store, complete_load = cp.prepare_store, cp.complete_load

        def recording_store(session_id: str, keys: Any, **kw: Any) -> Any:
            plan = prepare_store(session_id, keys, **kw)
            self.placed[self._storing] = None if plan is None else (
                session_id, plan.medium.name, plan.placement.rule.value)
            return plan

        def recording_load(request_id: Any, refilled: Any = ()) -> None:
            self.load_done_s[request_id] = node.now
            complete_load(request_id, refilled)

        cp.prepare_store = recording_store  # type: ignore[method-assign]
        cp.complete_load = recording_load  # type: ignore[method-assign]

    def on_arrival(self, req: Request) -> None:
        assert self.node is not None
        gpu = self.node.workers[req.worker].gpu
        gpu.drop(gpu.size)  # no GPU prefix: the store world restores every hit whole
        super().on_arrival(req)
        self.hits[req.idx] = req.sys.hit.num_blocks

    def _start_restore(self, req: Request) -> None:
        assert self.node is not None
        rec = self.node.rec
        before = (rec.ssd_read_commands, rec.ssd_read_bytes)
        super()._start_restore(req)
        self.reads[req.idx] = (rec.ssd_read_commands - before[0],
                               rec.ssd_read_bytes - before[1])

    def on_complete(self, req: Request) -> None:
        assert self.node is not None
        self._storing = req.idx
        self.complete_s[req.idx] = self.node.now
        super().on_complete(req)


def _replay_world(wl: Workload, geometry: KVGeometry) -> _Recorded:
    preset = _preset(geometry)
    system = _Recorded(preset.flatcake_config())
    node = Node(wl, system, preset.node, preset.geometry.with_block_size(BT), 0.1)
    node.run()
    assert node.num_done == wl.num_requests
    return system


def _block_kv(g: KVGeometry, block_ids: list[int]) -> list[torch.Tensor]:
    """Paged KV holding ``block_ids`` in slots 0.., each block's bytes a function of its
    id and layer (one tensor per layer, ``(2, slots, tokens, heads, dim)``)."""
    per_slot = 2 * g.tokens_per_block * g.num_kv_heads * g.head_dim * g.dtype_bytes
    out = []
    for layer in range(g.num_layers):
        ids_t = torch.tensor(block_ids, dtype=torch.int64)[:, None]
        raw = (ids_t * 7 + layer * 13 + torch.arange(per_slot)[None, :]) % 251
        raw = raw.to(torch.uint8).view(len(block_ids), 2, -1).transpose(0, 1).contiguous()
        out.append(raw.view(torch.float16).view(2, len(block_ids), g.tokens_per_block,
                                                g.num_kv_heads, g.head_dim))
    return out


def _store_world(wl: Workload, replay: _Recorded, root: Path, g: KVGeometry
                 ) -> dict[str, dict[int, Any]]:
    """The connector's part by hand: sessions and refcounts from ``control.signals``,
    the clock at the replay's times, every byte written and read back for real."""
    preset = _preset(g)
    clock = ManualClock()
    names = itertools.count()
    tracker = SessionTracker(max_sessions=wl.num_requests,
                             new_session_id=lambda: f"auto-{next(names)}")
    refcount = PrefixRefcount()
    all_keys = make_keys(wl.num_ids)
    got: dict[str, dict[int, Any]] = {"hits": {}, "reads": {}, "placed": {}}
    order = sorted(range(wl.num_requests), key=lambda i: float(wl.time_s[i]))
    with FlatCakeStore.open(root, g, preset.flatcake_config(), clock=clock) as store:
        for i in order:
            runs = wl.runs(i)
            keys = keys_of(all_keys, runs)
            blocks = [b for s, e in runs for b in range(s, e)]
            clock.set(float(replay.load_done_s.get(i, replay.complete_s[i])))
            hit = store.control.lookup(keys)
            turn = tracker.resolve(None, hit.num_blocks, hit_owner(store.control, hit))
            got["hits"][i] = hit.num_blocks
            if hit.num_blocks:
                dst = [torch.zeros_like(t) for t in _block_kv(g, blocks)]
                res = store.load(keys, dst, list(range(len(keys))))
                assert res.num_blocks == hit.num_blocks  # nothing damaged
                want = _block_kv(g, blocks[:res.num_blocks])
                assert all(torch.equal(d[:, :res.num_blocks].view(torch.uint8),
                                       w.view(torch.uint8)) for d, w in zip(dst, want,
                                                                            strict=True))
                if res.num_ssd_blocks:
                    got["reads"][i] = (res.commands, res.bytes_read)
            refcount.add(i, keys)  # prefill start
            clock.set(float(replay.complete_s[i]))
            # Nothing is stored between arrival and completion: the first block written
            # is the first one the arrival's hit missed.
            start = max(min(hit.num_blocks, len(keys) - 1), 0)
            signals = TurnSignals(turn.turn_index, int(wl.input_tokens[i]),
                                  turn.prev_reply_tokens, refcount.refcount(keys[start]))
            sid = turn.session_id
            res_store = store.store_turn(sid, keys, _block_kv(g, blocks),
                                         list(range(len(keys))), signals)
            got["placed"][i] = None if res_store.medium is None else (
                sid, res_store.medium.name, res_store.rule)
            full = min(len(keys), int(wl.input_tokens[i]) // BT)
            tracker.finish_turn(turn, int(wl.output_tokens[i]), full)
            refcount.remove(i)
    return got


@pytest.fixture(scope="module", params=[GEOMETRY, PADDED], ids=lambda g: g.name)
def worlds(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[_Recorded, dict[str, Any]]:
    g = request.param
    wl = _workload()
    replay = _replay_world(wl, g)
    return replay, _store_world(wl, replay, tmp_path_factory.mktemp("store"), g)


def test_the_scenario_covers_both_media_a_shared_prefix_and_a_reclaim(
        worlds: tuple[_Recorded, dict[str, Any]]) -> None:
    replay, _ = worlds
    media = {p[1] for p in replay.placed.values() if p is not None}
    assert media == {"MEMORY", "SSD"}
    assert replay.reads  # some restores read the SSD
    assert replay.num_reclaim_actions > 0
    sessions = {p[0] for p in replay.placed.values() if p is not None}
    assert len(sessions) >= 3


def test_same_placements(worlds: tuple[_Recorded, dict[str, Any]]) -> None:
    replay, store = worlds
    assert store["placed"] == replay.placed


def test_same_hits(worlds: tuple[_Recorded, dict[str, Any]]) -> None:
    replay, store = worlds
    assert store["hits"] == replay.hits


def test_same_ssd_reads(worlds: tuple[_Recorded, dict[str, Any]]) -> None:
    replay, store = worlds
    assert store["reads"] == replay.reads


def test_alignment_padding_is_read_and_counted(
        worlds: tuple[_Recorded, dict[str, Any]]) -> None:
    """Every byte read is wanted, another block of a segment read for its checksum, or
    a gap byte (alignment padding, a hole read through); with 5 KiB blocks every layer
    range of a segment starts or ends inside a 4 KiB unit, and the padding is read."""
    replay, _ = worlds
    assert replay.node is not None
    rec = replay.node.rec
    assert rec.ssd_read_bytes == (rec.ssd_useful_bytes + replay.read_check_bytes
                                  + replay.read_gap_bytes)
    assert rec.ssd_read_bytes % 4096 == 0
    if replay.node.geometry.block_bytes_per_layer % 4096:
        assert replay.read_gap_bytes > 0
