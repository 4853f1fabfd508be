"""Hierarchical all-reduce: reduce-scatter inside each node, all-reduce of the node's shard
across nodes (members with the same position in their node form a ring, one per NIC rail), then
all-gather inside each node. Inter-node traffic is S/m per member for m members per node.

Groups whose nodes hold different numbers of members fall back to the flat ring.
"""

from __future__ import annotations

import itertools

from netmodel.collectives.base import Channel, CollectiveCall, ceil_div
from netmodel.collectives.ring import RING


def _ring(order: tuple[int, ...], me: int, chunk: int, steps: int, chan: int) -> Channel:
    n = len(order)
    if n == 1:
        return
    pos = order.index(me)
    send = ((order[(pos + 1) % n], chunk, chan),)
    recv = ((order[(pos - 1) % n], chunk, chan),)
    for _ in range(steps):
        yield send, recv


class Hierarchical:
    name = "hierarchical"
    ops = frozenset({"all_reduce"})

    def channels(self, call: CollectiveCall, topo) -> list[Channel]:
        if call.n == 1:
            return []
        by_node: dict[int, list[int]] = {}
        for rank in call.ranks:
            by_node.setdefault(topo.rank_node[rank], []).append(rank)
        sizes = {len(v) for v in by_node.values()}
        if len(sizes) != 1 or len(by_node) == 1:
            return RING.channels(call, topo)
        m = sizes.pop()
        me = call.ranks[call.index]
        local = tuple(by_node[topo.rank_node[me]])
        pos = local.index(me)
        across = tuple(members[pos] for members in by_node.values())
        shard = ceil_div(call.size_bytes, m)
        intra_chunk = shard
        inter_chunk = ceil_div(shard, len(across))
        return [
            itertools.chain(
                _ring(local, me, intra_chunk, m - 1, 0),
                _ring(across, me, inter_chunk, 2 * (len(across) - 1), 1),
                _ring(local, me, intra_chunk, m - 1, 2),
            )
        ]


HIERARCHICAL = Hierarchical()
