"""Hierarchical all-reduce: reduce-scatter inside each node, all-reduce of the node's shard
across nodes (members with the same position in their node form a ring, one per NIC rail), then
all-gather inside each node. Inter-node traffic is S/m per member for m members per node.

Groups whose nodes hold different numbers of members fall back to the flat ring.
"""

from __future__ import annotations

from netmodel.collectives.base import CollectiveCall, Segment, SegmentAlgorithm, ceil_div, per_group
from netmodel.collectives.ring import RING, ring_segments


def _layout(ranks: tuple[int, ...], topo) -> dict[int, tuple] | None:
    """Per member: (its node's members, its position there, its rail ring, its position there);
    None when the nodes hold different numbers of members (or there is one node)."""
    by_node: dict[int, list[int]] = {}
    for rank in ranks:
        by_node.setdefault(topo.rank_node[rank], []).append(rank)
    sizes = {len(v) for v in by_node.values()}
    if len(sizes) != 1 or len(by_node) == 1:
        return None
    m = sizes.pop()
    across = [tuple(members[pos] for members in by_node.values()) for pos in range(m)]
    layout = {}
    for members in by_node.values():
        local = tuple(members)
        for pos, rank in enumerate(local):
            layout[rank] = (local, pos, across[pos], across[pos].index(rank))
    return layout


class Hierarchical(SegmentAlgorithm):
    name = "hierarchical"
    ops = frozenset({"all_reduce"})

    def segments(self, call: CollectiveCall, topo) -> list[list[Segment]]:
        if call.n == 1:
            return []
        layout = per_group("hierarchical", call.ranks, topo, _layout)
        if layout is None:
            return RING.segments(call, topo)
        local, pos, across, apos = layout[call.ranks[call.index]]
        m = len(local)
        shard = ceil_div(call.size_bytes, m)
        intra_chunk = shard
        inter_chunk = ceil_div(shard, len(across))
        return [
            ring_segments(local, pos, intra_chunk, m - 1, 0)
            + ring_segments(across, apos, inter_chunk, 2 * (len(across) - 1), 1)
            + ring_segments(local, pos, intra_chunk, m - 1, 2)
        ]


HIERARCHICAL = Hierarchical()
