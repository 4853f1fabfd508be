"""Recursive halving-doubling (Rabenseifner): reduce-scatter by recursive halving, then
all-gather by recursive doubling; log2(n) steps each, bandwidth-optimal for powers of two.

For n not a power of two, the first 2r members (r = n - 2^floor(log2 n)) pair up: the even one of
each pair hands its whole buffer to the odd one before, and receives the result after.
"""

from __future__ import annotations

from netmodel.collectives.base import Channel, CollectiveCall, Segment, SegmentAlgorithm, ceil_div, one_step_each


def _steps(call: CollectiveCall) -> Channel:
    n, me, size = call.n, call.index, call.size_bytes
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    ranks = call.ranks
    if me < 2 * extra:
        if me % 2 == 0:  # folded out: give data to the partner, get the result back
            yield ((ranks[me + 1], size, 0),), ()
            yield (), ((ranks[me + 1], size, 3),)
            return
        yield (), ((ranks[me - 1], size, 0),)
        vid = me // 2
    else:
        vid = me - extra

    def real(v: int) -> int:
        return ranks[2 * v + 1] if v < extra else ranks[v + extra]

    op = call.op
    if op in ("all_reduce", "reduce_scatter"):
        chunk, dist = size, p // 2
        while dist >= 1:
            chunk = ceil_div(chunk, 2)
            peer = real(vid ^ dist)
            yield ((peer, chunk, 1),), ((peer, chunk, 1),)
            dist //= 2
    if op in ("all_reduce", "all_gather"):
        chunk, dist = ceil_div(size, p), 1
        while dist < p:
            peer = real(vid ^ dist)
            yield ((peer, chunk, 2),), ((peer, chunk, 2),)
            chunk *= 2
            dist *= 2
    if me < 2 * extra:
        yield ((ranks[me - 1], size, 3),), ()


class HalvingDoubling(SegmentAlgorithm):
    name = "halving_doubling"
    ops = frozenset({"all_reduce", "reduce_scatter", "all_gather"})

    def segments(self, call: CollectiveCall, topo) -> list[list[Segment]]:
        if call.n == 1:
            return []
        return [one_step_each(_steps(call))]


HALVING_DOUBLING = HalvingDoubling()
