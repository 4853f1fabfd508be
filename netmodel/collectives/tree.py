"""Double binary tree all-reduce (NCCL's latency-friendly algorithm for large groups).

Two binary trees over the group, the second mirrored so that the leaves of one are the inner nodes
of the other; each reduces half of the data up to its root and broadcasts it back down, pipelined
in chunks. Its latency grows with log2(n) rather than n.
"""

from __future__ import annotations

from netmodel.collectives.base import Channel, CollectiveCall, ceil_div

CHUNK_BYTES = 1 << 20
MAX_CHUNKS = 16


def _pipeline(first: tuple, last: tuple, recv: tuple, chunks: int) -> Channel:
    """Chunk j: receive it in step j, pass it on in step j+1 (``first``-side sends)."""
    if not recv:
        for _ in range(chunks):
            yield first, ()
        return
    yield (), recv
    for _ in range(chunks - 1):
        yield first, recv
    if first:
        yield first, ()
    del last


def tree_channels(me_pos: int, n: int, ranks: tuple[int, ...], size: int, tree: int) -> list[Channel]:
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
        return [_pipeline(to_children, (), from_children, chunks)]
    parent = rank((me_pos - 1) // 2)
    up = _pipeline(((parent, chunk, up_chan),), (), from_children, chunks)
    down = _pipeline(to_children, (), ((parent, chunk, down_chan),), chunks)
    return [up, down]


class DoubleBinaryTree:
    name = "tree"
    ops = frozenset({"all_reduce"})

    def channels(self, call: CollectiveCall, topo) -> list[Channel]:
        n = call.n
        if n == 1:
            return []
        half = ceil_div(call.size_bytes, 2)
        result: list[Channel] = []
        for tree in (0, 1):
            pos = call.index if tree == 0 else n - 1 - call.index
            result.extend(tree_channels(pos, n, call.ranks, half, tree))
        return result


DOUBLE_BINARY_TREE = DoubleBinaryTree()
