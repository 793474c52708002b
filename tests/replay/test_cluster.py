"""The replay at cluster scale: routing between nodes, KV shared through the cluster
index (remote hits, their cost on the NIC and the owner's SSD), and one node unchanged."""

from __future__ import annotations

import dataclasses

import pytest

from flatcake.replay.cluster import ClusterSpec, replay_cluster, run_cluster, session_node
from flatcake.replay.node.devices import NetSpec
from flatcake.replay.simulate import run_replay
from flatcake.replay.workload.trace import from_sessions
from tests.replay.helpers import BLOCK_BYTES, GEOMETRY, ids, tiny_preset

BT = GEOMETRY.tokens_per_block
SHARING = ["flatcake", "flatcake-1q", "tiered-direct"]


def _two_turns() -> object:
    # One session: turn 0 computes 20 blocks, turn 1 (30 s later) extends them by 5.
    session = [(ids(0, 20), 20 * BT, 500, 0.0), (ids(0, 25), 25 * BT, 10, 30.0)]
    return from_sessions([session], BT)


def _preset(**kw: object) -> object:
    return tiny_preset(**{"gpu_blocks": 80, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("system", SHARING)
def test_round_robin_second_turn_is_a_remote_hit_only_with_sharing(system: str) -> None:
    wl = _two_turns()
    shared_m, shared = replay_cluster(wl, system, 1.0, _preset(),
                                      ClusterSpec(2, "round_robin", True))
    alone_m, alone = replay_cluster(wl, system, 1.0, _preset(),
                                    ClusterSpec(2, "round_robin", False))
    # Turn 0 ran on node 0, turn 1 on node 1.
    assert list(shared.requests_per_node) == [1, 1]
    assert list(shared.rec.hit_blocks) == [0, 20]  # turn 0's 20 blocks, from node 0
    assert list(alone.rec.hit_blocks) == [0, 0]  # node 1 never saw them: recomputed
    assert shared_m.extra["remote_blocks"] == 20
    assert shared_m.extra["remote_transfers"] == 1
    remote = shared_m.extra["remote_memory_bytes"] + shared_m.extra["remote_ssd_bytes"]
    assert remote >= 20 * BLOCK_BYTES
    assert alone_m.extra["remote_blocks"] == 0
    assert shared_m.ttft_mean_s < alone_m.ttft_mean_s  # a restore beats recomputing
    assert shared_m.hit_rate_gpu == pytest.approx(shared_m.max_hit_rate)


def test_remote_ssd_block_costs_the_owners_ssd_read_and_the_nic() -> None:
    # FlatCake places turn 0 (first turn) on SSD: node 1 reads it from node 0's SSD.
    wl = _two_turns()
    m, cluster = replay_cluster(wl, "flatcake", 1.0, _preset(),
                                ClusterSpec(2, "round_robin", True))
    assert m.extra["remote_ssd_bytes"] >= 20 * BLOCK_BYTES
    owner_ssd = sum(w.ssd.num_bytes for w in cluster.nodes[0].workers)
    assert owner_ssd >= 2 * 20 * BLOCK_BYTES  # its own write, then the remote read
    nic = cluster.nics[1][0]
    assert nic.num_bytes == m.extra["remote_ssd_bytes"] + m.extra["remote_memory_bytes"]
    assert nic.num_jobs == 1


@pytest.mark.parametrize("system", ["flatcake", "tiered-direct"])
def test_a_slower_network_delays_the_remote_restore(system: str) -> None:
    wl = _two_turns()
    fast = _preset()
    slow = dataclasses.replace(fast, net=NetSpec(bytes_per_s=1e6, latency_s=0.01))
    spec = ClusterSpec(2, "round_robin", True)
    _, cf = replay_cluster(wl, system, 1.0, fast, spec)
    _, cs = replay_cluster(wl, system, 1.0, slow, spec)
    nbytes = cs.nics[1][0].num_bytes
    assert nbytes == cf.nics[1][0].num_bytes > 0
    ttft_f = cf.rec.first_token_s[1] - cf.rec.arrival_s[1]
    ttft_s = cs.rec.first_token_s[1] - cs.rec.arrival_s[1]
    # At 1 MB/s the transfer dominates: it adds its bytes' time and the latency.
    assert ttft_s - ttft_f == pytest.approx(nbytes / 1e6 + 0.01
                                            - (nbytes / fast.net.bytes_per_s
                                               + fast.net.latency_s), rel=0.02)
    assert list(cs.rec.hit_blocks) == list(cf.rec.hit_blocks) == [0, 20]


def _sessions(count: int, turns: int) -> object:
    # ``count`` sessions of ``turns`` turns growing by 4 blocks from 8 (replies of 500
    # tokens on the first two turns, 10 after), 5 s apart.
    sessions = []
    for k in range(count):
        base = 1000 * k
        sessions.append([(ids(base, base + 8 + 4 * t), (8 + 4 * t) * BT, 500 if t < 2 else 10,
                          0.0 if t == 0 else 5.0) for t in range(turns)])
    return from_sessions(sessions, BT)


def _many_sessions() -> object:
    return _sessions(6, 3)


@pytest.mark.parametrize("system", SHARING)
def test_session_affine_routing_keeps_a_session_on_one_node(system: str) -> None:
    wl = _many_sessions()
    m, cluster = replay_cluster(wl, system, 1.0, _preset(workers=2),
                                ClusterSpec(3, "session", True))
    expected = [0, 0, 0]
    for i in range(wl.num_requests):
        expected[session_node(int(wl.session[i]), 3)] += 1
    assert [node.num_done for node in cluster.nodes] == expected
    assert list(cluster.requests_per_node) == expected
    # Per-session ids: nothing to find elsewhere.
    assert m.extra["remote_blocks"] == 0
    alone = run_cluster(wl, system, 1.0, _preset(workers=2), ClusterSpec(3, "session", False))
    assert alone.hit_rate_gpu == pytest.approx(m.hit_rate_gpu)


def _four_turns() -> object:
    # With 20 blocks of host memory, copies get dropped and SSD segments are read whole
    # again (what ``copy_on_restore`` refills).
    return _sessions(12, 4)


def _copies(preset: object, copy_on_restore: bool) -> object:
    fc = preset.flatcake  # type: ignore[attr-defined]
    placement = dataclasses.replace(fc.placement, memory_copy_watermark=0.9,
                                    copy_on_restore=copy_on_restore)
    return dataclasses.replace(preset, flatcake=dataclasses.replace(fc, placement=placement))


@pytest.mark.parametrize("copy_on_restore", [False, True])
@pytest.mark.parametrize("system", ["flatcake", "tiered-direct", "memory-only"])
def test_one_node_is_the_one_node_replay(system: str, copy_on_restore: bool) -> None:
    wl = _four_turns()
    preset = _copies(_preset(workers=2, host_blocks=20), copy_on_restore)
    plain = run_replay(wl, system, 1.0, preset).to_dict()
    one = run_cluster(wl, system, 1.0, preset, ClusterSpec(1, "round_robin", True)).to_dict()
    built = replay_cluster(wl, system, 1.0, preset, ClusterSpec(1, "session", True))[0]
    built_d = built.to_dict()
    for d in (plain, one, built_d):
        d.pop("wall_s")
        d.pop("cpu_s")
    assert one == plain
    # The cluster machinery itself (one loop, one recorder, the sharing system's class)
    # changes no figure, field by field; it only adds its own counters.
    extra, plain_extra = built_d.pop("extra"), plain.pop("extra")
    assert built_d == plain
    assert {k: extra[k] for k in plain_extra} == plain_extra
    assert extra["remote_blocks"] == 0


def test_a_restore_with_remote_blocks_refills_its_local_part() -> None:
    # Round robin on 2 nodes: a session's turns alternate, so a restore reads its own
    # node's older segments and the other node's newer ones. With copy_on_restore the
    # local part fills memory copies as on one node (remote blocks fill none). Each node
    # also stores the blocks it fetched (as the store and the connector do), so six
    # turns pass before its copies are dropped and its segments read whole again.
    wl = _sessions(12, 6)
    spec = ClusterSpec(2, "round_robin", True)
    made = {}
    for on in (False, True):
        m, _ = replay_cluster(wl, "flatcake", 1.0,
                              _copies(_preset(host_blocks=20, gpu_blocks=60), on), spec)
        assert m.extra["remote_blocks"] > 0
        made[on] = m.extra["memory_copies_made"]
    assert made[True] > made[False]


def test_round_robin_spreads_requests_evenly() -> None:
    wl = _many_sessions()
    _, cluster = replay_cluster(wl, "flatcake", 1.0, _preset(workers=2),
                                ClusterSpec(3, "round_robin", True))
    assert list(cluster.requests_per_node) == [6, 6, 6]


def test_bad_cluster_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="nodes"):
        ClusterSpec(0)
    with pytest.raises(ValueError, match="routing"):
        ClusterSpec(2, "prefix")
    with pytest.raises(ValueError, match="cannot share"):
        run_cluster(_two_turns(), "tiered", 1.0, _preset(), ClusterSpec(2, "session", True))
    with pytest.raises(ValueError, match=r"net\.bytes_per_s"):
        NetSpec(bytes_per_s=0)
    # Without sharing every system runs on a cluster.
    m = run_cluster(_two_turns(), "tiered", 1.0, _preset(), ClusterSpec(2, "session", False))
    assert m.num_requests == 2
