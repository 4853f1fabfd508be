"""The message core's route rows (netcore.NetCore.rid, written from Topology.route_links without a
Route object) against the topology's routes."""

from __future__ import annotations

import random

import pytest

from emulator.config.loader import load_cluster
from emulator.engine.netcore import NetCore
from emulator.engine.netlayout import RT_LINKS
from emulator.engine.stats import ShardStats
from netmodel.topology import Topology


@pytest.mark.parametrize(
    "cluster, overrides, pairs",
    [("hetero-a100-h100", [], None), ("dgx-h100-ndr", ["nodes=66"], 3000), ("commodity-pcie-ethernet", [], None)],
)
def test_route_rows_are_the_topologys_routes(cluster, overrides, pairs):
    """Every pair (or a sample: 66 nodes span three tiers), links with differing bandwidths: the
    row holds the route's tier, latency, links and slowest bandwidth of each side; asked again, the
    same row."""
    topo = Topology(load_cluster(cluster, overrides))
    rng = random.Random(11)
    for link in rng.sample(range(len(topo.link_bw)), len(topo.link_bw) // 3):
        topo.link_bw[link] *= rng.choice([0.25, 0.5, 0.9])  # (as whole-run slow links do, before any route)
    world = topo.world_size
    if pairs is None:
        todo = [(src, dst) for src in range(world) for dst in range(world) if src != dst]
    else:
        todo = [(rng.randrange(world), rng.randrange(world)) for _ in range(pairs)]
    core = NetCore(topo, 0, [0] * world, 1, ShardStats(topo))
    rows, tiers = {}, set()
    for src, dst in todo:
        rows[src, dst] = rid = core.rid(src, dst)
        route = topo.route(src, dst)
        # (the route itself, from what the topology says of the pair, not from route_links)
        tier = topo.tier_of(src, dst)
        assert route.tier == tier, (src, dst)
        if tier == 0:
            assert route.latency_ns == topo.su_latency_ns[topo.rank_node[src]], (src, dst)
            assert (route.up, route.down) == ((topo.su_tx[src],), (topo.su_rx[dst],)), (src, dst)
        else:
            assert route.latency_ns == topo.tier_latency_ns[tier], (src, dst)
            assert len(route.up) == len(route.down) == tier, (src, dst)
            assert route.up[0] in topo.nic_tx[topo.rank_node[src]], (src, dst)
            assert route.down[-1] in topo.nic_rx[topo.rank_node[dst]], (src, dst)
        nup, ndown = len(route.up), len(route.down)
        row = core.rt[rid].tolist()
        assert row[:RT_LINKS] == [route.tier, route.latency_ns, nup, ndown], (src, dst)
        assert row[RT_LINKS : RT_LINKS + nup + ndown] == [*route.up, *route.down], (src, dst)
        assert core.rbw[rid].tolist() == [route.up_bw, route.down_bw], (src, dst)
        tiers.add(route.tier)
    assert all(core.rid(src, dst) == rid for (src, dst), rid in rows.items())
    assert len(set(rows.values())) == len(rows)  # a row per pair
    assert tiers == set(range(len(topo.tier_names))), tiers  # every tier met
