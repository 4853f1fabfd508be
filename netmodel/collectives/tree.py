"""Double binary tree all-reduce (NCCL's latency-friendly algorithm for large groups).

Two binary trees over the group, the second mirrored so that the leaves of one are the inner nodes
of the other; each reduces half of the data up to its root and broadcasts it back down, pipelined
in chunks. Its latency grows with log2(n) rather than n.
"""

from __future__ import annotations

from netmodel.collectives.base import CollectiveCall, Segment, SegmentAlgorithm, ceil_div
from netmodel.collectives.ring import pipeline_segments

CHUNK_BYTES = 1 << 20
MAX_CHUNKS = 16


def tree_channels(me_pos: int, n: int, ranks: tuple[int, ...], size: int, tree: int) -> list[list[Segment]]:
    """The up (reduce) and down (broadcast) channels of one member in one heap-shaped tree."""
    chunks = max(1, min(MAX_CHUNKS, ceil_div(size, CHUNK_BYTES)))
    chunk = ceil_div(size, chunks)
    up_chan, down_chan = 2 * tree, 2 * tree + 1

    def rank(pos: int) -> int:  # tree 1 is mirrored
        return ranks[pos if tree == 0 else n - 1 - pos]

    children = [c for c in (2 * me_pos + 1, 2 * me_pos + 2) if c < n]
    from_children = tuple((rank(c), chunk, up_chan) for c in children)
    to_children = tuple((rank(c), chunk, down_chan) for c in children)
    if me_pos == 0:  # root: reduce from children, then send the result straight back down
        return [pipeline_segments(to_children, from_children, chunks)]
    parent = rank((me_pos - 1) // 2)
    up = pipeline_segments(((parent, chunk, up_chan),), from_children, chunks)
    down = pipeline_segments(to_children, ((parent, chunk, down_chan),), chunks)
    return [up, down]


class DoubleBinaryTree(SegmentAlgorithm):
    name = "tree"
    ops = frozenset({"all_reduce"})

    def segments(self, call: CollectiveCall, topo) -> list[list[Segment]]:
        n = call.n
        if n == 1:
            return []
        half = ceil_div(call.size_bytes, 2)
        result: list[list[Segment]] = []
        for tree in (0, 1):
            pos = call.index if tree == 0 else n - 1 - call.index
            result.extend(tree_channels(pos, n, call.ranks, half, tree))
        return result


DOUBLE_BINARY_TREE = DoubleBinaryTree()
