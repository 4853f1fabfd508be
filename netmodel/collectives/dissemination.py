"""Dissemination barrier: ceil(log2 n) rounds of empty messages to the member 2^k ahead."""

from __future__ import annotations

from netmodel.collectives.base import Channel, CollectiveCall, Segment, SegmentAlgorithm, one_step_each


def _steps(call: CollectiveCall) -> Channel:
    n, me, ranks = call.n, call.index, call.ranks
    dist = 1
    while dist < n:
        yield ((ranks[(me + dist) % n], 0, 0),), ((ranks[(me - dist) % n], 0, 0),)
        dist *= 2


class Dissemination(SegmentAlgorithm):
    name = "dissemination"
    ops = frozenset({"barrier"})

    def segments(self, call: CollectiveCall, topo) -> list[list[Segment]]:
        return [one_step_each(_steps(call))] if call.n > 1 else []


DISSEMINATION = Dissemination()
