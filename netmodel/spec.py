"""The cluster spec: node groups of GPUs and the tiers of the network (the run file's ``cluster:``).

It lives with the network model, which builds the topology from it and must not import the engine;
emulator/config/cluster.py re-exports it.

A homogeneous cluster is written with top-level ``nodes, gpus_per_node, gpu, scale_up, nic``
(so ``--set cluster.nodes=2`` resizes a preset); a heterogeneous one as a list ``node_groups`` of the
same keys. Internally every cluster is a list of node groups (see :meth:`ClusterConfig.groups`).

Bandwidths are per direction: ``bandwidth_GBps`` in 10^9 bytes/s, NIC ``bandwidth_Gbps`` in 10^9
bits/s as network vendors quote them. Latencies are end-to-end for a message routed at that tier.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from netmodel import limits as lim
from netmodel.rules import require, require_range, shown


@dataclass
class ScaleUpConfig:
    """The fabric inside a node (NVLink/NVSwitch, Infinity Fabric, PCIe): one port per GPU."""

    name: str = "nvswitch"
    bandwidth_GBps: float = 300.0  # per GPU, per direction
    latency_us: float = 2.0  # end to end, one message
    efficiency: float = 1.0  # achievable fraction of bandwidth (link-level, not per model)
    algorithms: dict[str, str] = field(default_factory=dict)  # op -> default algorithm on this tier

    def validate(self, path: str) -> None:
        require_range(self, path, "bandwidth_GBps", lim.MIN_BANDWIDTH_GBPS, lim.MAX_BANDWIDTH_GBPS)
        require_range(self, path, "latency_us", 0, lim.MAX_LATENCY_US)
        require_range(self, path, "efficiency", lim.MIN_EFFICIENCY, 1)


@dataclass
class NicConfig:
    """Scale-out NICs of a node; GPU i uses NIC i % count (rail-optimised wiring)."""

    count: int = 1
    bandwidth_Gbps: float = 200.0  # per NIC, per direction
    efficiency: float = 1.0

    def validate(self, path: str) -> None:
        require_range(self, path, "count", 1, lim.MAX_NICS_PER_NODE)
        require_range(self, path, "bandwidth_Gbps", lim.MIN_BANDWIDTH_GBITPS, lim.MAX_BANDWIDTH_GBITPS)
        require_range(self, path, "efficiency", lim.MIN_EFFICIENCY, 1)


@dataclass
class SwitchTierConfig:
    """One scale-out switch tier (leaf, spine, core ...), listed from the lowest.

    ``span_nodes`` is how many consecutive nodes one switch group of this tier connects (0: all of
    them). ``oversubscription`` (e.g. 3 for 3:1) divides the bandwidth a node has towards the tier
    above; it is modelled as each node's share of the uplinks, owned by the node's shard.
    """

    name: str = "leaf"
    span_nodes: int = 0
    latency_us: float = 5.0
    oversubscription: float = 1.0
    algorithms: dict[str, str] = field(default_factory=dict)

    def validate(self, path: str) -> None:
        require(self.span_nodes >= 0, f"{path}.span_nodes must be >= 0 (0 = all nodes), got {self.span_nodes}")
        require_range(self, path, "span_nodes", 0, lim.MAX_NODES)
        require_range(self, path, "latency_us", 0, lim.MAX_LATENCY_US, low_open=True)
        require_range(self, path, "oversubscription", 1, lim.MAX_TOTAL_OVERSUBSCRIPTION)


@dataclass
class NodeGroupConfig:
    """Nodes of one kind: how many, GPUs per node, GPU type, and their fabric and NICs."""

    name: str = "nodes"
    nodes: int = 1
    gpus_per_node: int = 8
    gpu: str = "a100-sxm-80gb"
    scale_up: ScaleUpConfig = field(default_factory=ScaleUpConfig)
    nic: NicConfig = field(default_factory=NicConfig)

    def validate(self, path: str) -> None:
        require_range(self, path, "nodes", 1, lim.MAX_NODES)
        require_range(self, path, "gpus_per_node", 1, lim.MAX_GPUS_PER_NODE)


@dataclass
class ClusterConfig:
    """A cluster: one node group (top-level keys) or several (``node_groups``) and switch tiers."""

    name: str = "cluster"
    nodes: int | None = None
    gpus_per_node: int | None = None
    gpu: str | None = None
    scale_up: ScaleUpConfig | None = None
    nic: NicConfig | None = None
    node_groups: list[NodeGroupConfig] | None = None
    tiers: list[SwitchTierConfig] = field(default_factory=list)

    def validate(self, path: str) -> None:
        flat = [k for k in ("nodes", "gpus_per_node", "gpu", "scale_up", "nic") if getattr(self, k) is not None]
        if self.node_groups is not None:
            require(not flat, f"{path}: give either node_groups or {', '.join(flat)}, not both")
            require(len(self.node_groups) >= 1, f"{path}.node_groups must not be empty")
            names = [g.name for g in self.node_groups]
            require(len(set(names)) == len(names), f"{path}.node_groups: names must be unique, got {shown(names)}")
        else:
            require(self.nodes is not None, f"missing key '{path}.nodes' (or give '{path}.node_groups')")
            require_range(self, path, "nodes", 1, lim.MAX_NODES)
            require_range(self, path, "gpus_per_node", 1, lim.MAX_GPUS_PER_NODE)
        self._validate_size(path)
        spans = self.tier_spans()
        for i in range(1, len(spans)):
            require(
                spans[i] >= spans[i - 1] and (spans[i] % spans[i - 1] == 0 or spans[i] == self.total_nodes),
                f"{path}.tiers[{i}].span_nodes ({self.tiers[i].span_nodes}) must be a multiple of "
                f"tiers[{i - 1}].span_nodes ({self.tiers[i - 1].span_nodes})",
            )
        if self.total_nodes > 1:
            require(self.tiers, f"{path}.tiers: {self.total_nodes} nodes need at least one switch tier")
            require(
                spans[-1] >= self.total_nodes,
                f"{path}.tiers: the top tier spans {spans[-1]} nodes but the cluster has {self.total_nodes}; "
                f"set span_nodes: 0 on the top tier",
            )

    def _validate_size(self, path: str) -> None:
        """The whole cluster within the emulator's limits (emulator/config/limits.py): world size,
        nodes, tiers, and the slowest uplink share (NIC bandwidth over all tiers' oversubscription)."""
        require(
            self.total_nodes <= lim.MAX_NODES,
            f"{path}: {self.total_nodes} nodes; the emulator's limit is {lim.MAX_NODES}",
        )
        require(
            self.world_size <= lim.MAX_WORLD_SIZE,
            f"{path}: world size {self.world_size} GPUs; the emulator's limit is {lim.MAX_WORLD_SIZE}",
        )
        require(len(self.tiers) <= lim.MAX_TIERS, f"{path}.tiers: {len(self.tiers)} tiers; at most {lim.MAX_TIERS}")
        total = 1.0
        for tier in self.tiers:
            total *= tier.oversubscription
        require(
            total <= lim.MAX_TOTAL_OVERSUBSCRIPTION,
            f"{path}.tiers: total oversubscription {total:g} (the product over tiers) must be <= "
            f"{lim.MAX_TOTAL_OVERSUBSCRIPTION:g}",
        )

    def groups(self) -> list[NodeGroupConfig]:
        """The node groups, the homogeneous form turned into a single group."""
        if self.node_groups is not None:
            return self.node_groups
        return [
            NodeGroupConfig(
                name=self.name,
                nodes=self.nodes or 1,
                gpus_per_node=self.gpus_per_node or 8,
                gpu=self.gpu or "a100-sxm-80gb",
                scale_up=self.scale_up or ScaleUpConfig(),
                nic=self.nic or NicConfig(),
            )
        ]

    def tier_spans(self) -> list[int]:
        """Nodes under one switch group of each tier, clipped to the cluster (0 means all)."""
        total = self.total_nodes
        return [min(t.span_nodes or total, total) for t in self.tiers]

    @property
    def total_nodes(self) -> int:
        return sum(g.nodes for g in self.groups())

    @property
    def world_size(self) -> int:
        return sum(g.nodes * g.gpus_per_node for g in self.groups())
