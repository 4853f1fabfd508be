"""All-to-all: pairwise exchange (n-1 steps, one peer each) and direct (every message at once).

``size_bytes`` is each member's whole send buffer; S/n goes to every peer.
"""

from __future__ import annotations

from netmodel.collectives.base import Channel, CollectiveCall, Segment, SegmentAlgorithm, ceil_div, one_step_each


def _pairwise(call: CollectiveCall) -> Channel:
    n, me, ranks = call.n, call.index, call.ranks
    chunk = ceil_div(call.size_bytes, n)
    for k in range(1, n):
        yield ((ranks[(me + k) % n], chunk, 0),), ((ranks[(me - k) % n], chunk, 0),)


def _direct(call: CollectiveCall) -> Channel:
    n, me, ranks = call.n, call.index, call.ranks
    chunk = ceil_div(call.size_bytes, n)
    sends = tuple((ranks[(me + k) % n], chunk, 0) for k in range(1, n))
    recvs = tuple((ranks[(me - k) % n], chunk, 0) for k in range(1, n))
    yield sends, recvs


class Pairwise(SegmentAlgorithm):
    name = "pairwise"
    ops = frozenset({"all_to_all"})

    def segments(self, call: CollectiveCall, topo) -> list[list[Segment]]:
        return [one_step_each(_pairwise(call))] if call.n > 1 else []


class Direct(SegmentAlgorithm):
    name = "direct"
    ops = frozenset({"all_to_all"})

    def segments(self, call: CollectiveCall, topo) -> list[list[Segment]]:
        return [one_step_each(_direct(call))] if call.n > 1 else []


PAIRWISE = Pairwise()
DIRECT = Direct()
