"""The cluster as ranks, nodes, links and routes (pure; no engine state).

Links (each a FIFO server with a bandwidth) and who owns them:

- ``scale-up tx/rx`` of every GPU: its port into the node's fabric (NVSwitch, Infinity Fabric, PCIe);
- ``nic tx/rx`` of every NIC: GPU ``i`` of a node uses NIC ``i % count`` (rail-optimised wiring);
- ``up/down`` of every NIC towards switch tier ``k+1``: the NIC's share of its tier-``k`` switch
  group's uplinks, ``NIC bandwidth / (oversubscription of tiers 0..k)``. This is exact for the
  rail-optimised fabrics of DGX-class clusters (each rail has its own leaf switches and uplinks)
  and an approximation for top-of-rack designs (a flow cannot borrow the idle share of another NIC
  of its node). Modelling oversubscription as per-NIC shares keeps every link owned by one node,
  hence by one shard (ARCHITECTURE.md), and keeps the rails of a node independent.

Degraded links (``faults.slow_link`` of the run file) are resolved when the topology is built
(netmodel/links.py: whole-run factors scale ``link_bw``, windowed ones become ``link_windows``).
They travel with the cluster config as ``cluster.faults`` (set when the run config is validated)
because the topology is built from the cluster in several processes (the run, each Ray shard, the
monitor).

A message takes the lowest tier connecting its endpoints; its path splits into an *up* part owned
by the sender's node and a *down* part owned by the receiver's node.
"""

from __future__ import annotations

from dataclasses import dataclass

from netmodel.links import resolve_slow_links
from netmodel.spec import ClusterConfig

SCALE_UP_TIER = 0  # tier index of the intra-node fabric; switch tier k has index k + 1


@dataclass(frozen=True)
class Route:
    """How a message from ``src`` to ``dst`` travels: links sender-side, links receiver-side."""

    tier: int
    up: tuple[int, ...]
    down: tuple[int, ...]
    latency_ns: int
    up_bw: float  # bytes per ns of the slowest up link
    down_bw: float


class Topology:
    """Ranks, nodes, links and routes of one cluster; immutable once built."""

    def __init__(self, cluster: ClusterConfig):
        self.cluster = cluster
        self.groups = cluster.groups()
        self.tier_names: list[str] = []
        self.tier_latency_ns: list[int] = []
        self.link_bw: list[float] = []  # bytes per ns, efficiency included
        self.link_tier: list[int] = []
        self.link_node: list[int] = []  # owning node
        self.link_name: list[str] = []
        self.rank_node: list[int] = []
        self.rank_local: list[int] = []
        self.node_group: list[int] = []
        self.node_first_rank: list[int] = []
        self.node_gpus: list[int] = []
        self._build()
        # link -> product of the whole-run slow-link factors applied to it (absent: nominal bandwidth)
        self.link_factor: dict[int, float] = {}
        # link -> its slow-link time windows, (start_ns, end_ns, factor) (netmodel/links.py)
        self.link_windows: dict[int, list[tuple[int, int, float]]] = {}
        self.slow_links: list[dict] = []  # the slow-link entries as applied (resolve_slow_links)
        self.faults = getattr(cluster, "faults", None)  # the run's FaultsConfig, if any
        if self.faults is not None:
            resolve_slow_links(self, self.faults.slow_link)
        self._routes: dict[tuple[int, int], Route] = {}

    # -- construction -------------------------------------------------------------------------
    def _add_link(self, name: str, bw_bytes_per_ns: float, tier: int, node: int) -> int:
        self.link_name.append(name)
        self.link_bw.append(bw_bytes_per_ns)
        self.link_tier.append(tier)
        self.link_node.append(node)
        return len(self.link_bw) - 1

    def _build(self) -> None:
        tiers = self.cluster.tiers
        self.tier_names = [self.groups[0].scale_up.name] + [t.name for t in tiers]
        # the scale-up latency may differ per node group; keep one figure per tier for reports
        self.tier_latency_ns = [round(self.groups[0].scale_up.latency_us * 1000)] + [
            round(t.latency_us * 1000) for t in tiers
        ]
        self.tier_span_nodes = [1] + self.cluster.tier_spans()
        self.su_tx: list[int] = []
        self.su_rx: list[int] = []
        self.su_latency_ns: list[int] = []  # per node
        self.nic_tx: list[list[int]] = []
        self.nic_rx: list[list[int]] = []
        self.up: list[list[list[int]]] = []  # [node][nic][k]: the NIC's uplink share above switch tier k
        self.down: list[list[list[int]]] = []
        node = 0
        for gi, group in enumerate(self.groups):
            su_bw = group.scale_up.bandwidth_GBps * group.scale_up.efficiency
            nic_bw = group.nic.bandwidth_Gbps / 8 * group.nic.efficiency
            for _ in range(group.nodes):
                self.node_group.append(gi)
                self.node_first_rank.append(len(self.rank_node))
                self.node_gpus.append(group.gpus_per_node)
                self.su_latency_ns.append(round(group.scale_up.latency_us * 1000))
                for local in range(group.gpus_per_node):
                    rank = len(self.rank_node)
                    self.rank_node.append(node)
                    self.rank_local.append(local)
                    self.su_tx.append(self._add_link(f"gpu{rank}.{group.scale_up.name}.tx", su_bw, 0, node))
                    self.su_rx.append(self._add_link(f"gpu{rank}.{group.scale_up.name}.rx", su_bw, 0, node))
                tx, rx = [], []
                first_tier = 1 if tiers else 0
                for k in range(group.nic.count):
                    tx.append(self._add_link(f"node{node}.nic{k}.tx", nic_bw, first_tier, node))
                    rx.append(self._add_link(f"node{node}.nic{k}.rx", nic_bw, first_tier, node))
                self.nic_tx.append(tx)
                self.nic_rx.append(rx)
                ups, downs = [], []
                for nic in range(group.nic.count):
                    share = nic_bw
                    nic_ups, nic_downs = [], []
                    for k in range(len(tiers) - 1):
                        share /= tiers[k].oversubscription
                        name = f"node{node}.nic{nic}.{tiers[k].name}-{tiers[k + 1].name}"
                        nic_ups.append(self._add_link(f"{name}.up", share, k + 2, node))
                        nic_downs.append(self._add_link(f"{name}.down", share, k + 2, node))
                    ups.append(nic_ups)
                    downs.append(nic_downs)
                self.up.append(ups)
                self.down.append(downs)
                node += 1

    # -- queries ------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return len(self.rank_node)

    @property
    def num_nodes(self) -> int:
        return len(self.node_group)

    def gpu_type(self, rank: int) -> str:
        return self.groups[self.node_group[self.rank_node[rank]]].gpu

    def tier_of(self, src: int, dst: int) -> int:
        """Index of the lowest tier connecting two ranks (0: same node)."""
        a, b = self.rank_node[src], self.rank_node[dst]
        if a == b:
            return SCALE_UP_TIER
        for k, span in enumerate(self.tier_span_nodes[1:]):
            if a // span == b // span:
                return k + 1
        raise AssertionError("validated clusters connect every pair of nodes")

    def route(self, src: int, dst: int) -> Route:
        """The route of a message; cached because programs reuse few pairs."""
        key = (src, dst)
        route = self._routes.get(key)
        if route is None:
            route = self._routes[key] = self._compute_route(src, dst)
        return route

    def _compute_route(self, src: int, dst: int) -> Route:
        tier, latency, up, down = self.route_links(src, dst)
        return Route(
            tier=tier,
            up=up,
            down=down,
            latency_ns=latency,
            up_bw=min(self.link_bw[i] for i in up),
            down_bw=min(self.link_bw[i] for i in down),
        )

    def route_links(self, src: int, dst: int) -> tuple[int, int, tuple[int, ...], tuple[int, ...]]:
        """``(tier, latency_ns, up, down)`` of the route from ``src`` to ``dst``, not cached: for
        callers that keep their own table of routes (netcore.NetCore.rid: a row per pair) and would
        only pay for a :class:`Route` built and kept here."""
        tier = self.tier_of(src, dst)
        if tier == SCALE_UP_TIER:
            return tier, self.su_latency_ns[self.rank_node[src]], (self.su_tx[src],), (self.su_rx[dst],)
        a, b = self.rank_node[src], self.rank_node[dst]
        rail_a = self.rank_local[src] % len(self.nic_tx[a])
        rail_b = self.rank_local[dst] % len(self.nic_rx[b])
        up = (self.nic_tx[a][rail_a], *self.up[a][rail_a][: tier - 1])
        down = (*reversed(self.down[b][rail_b][: tier - 1]), self.nic_rx[b][rail_b])
        return tier, self.tier_latency_ns[tier], up, down

    def min_cross_node_latency_ns(self) -> int:
        """Lookahead of the conservative protocol: no cross-node message arrives sooner."""
        return min(self.tier_latency_ns[1:], default=0)
