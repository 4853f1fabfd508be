"""What a collective algorithm produces: per member, channels of steps of size-only messages.

A *step* is a tuple ``(sends, recvs)``; each send or receive is ``(peer_rank, size_bytes, chan)``.
All sends and receives of a step are issued together when the step starts; the step ends when its
sends have left the sender and its receives have arrived. Steps of one channel run in order;
channels run concurrently (NCCL's channels). ``chan`` is the logical stream a message belongs to,
the same number on both ends, so that messages match however the two members schedule them.

Algorithms describe each channel as *segments* ``(sends, recvs, repeat)``: the same step repeated
``repeat`` times, so that a 3072-member ring is one segment, not 6142 steps per rank. The
message-level engine (emulator/engine/netkernels.py) reads segments directly; :func:`expand` turns
them into the step iterators of the reference path.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

Transfer = tuple[int, int, int]  # (peer rank, size_bytes, chan)
Step = tuple[tuple[Transfer, ...], tuple[Transfer, ...]]
Channel = Iterator[Step]
Segment = tuple[tuple[Transfer, ...], tuple[Transfer, ...], int]  # (sends, recvs, repeat)

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "barrier")


@dataclass(frozen=True)
class CollectiveCall:
    """One member's view of a collective: what, how big, among whom, and where it stands."""

    op: str
    size_bytes: int  # nccl-tests convention: whole buffer (all_reduce), gathered total (AG/RS)
    ranks: tuple[int, ...]  # the process group, in ring order
    index: int  # this member's position in ``ranks``
    root_index: int = 0  # broadcast / reduce

    @property
    def n(self) -> int:
        return len(self.ranks)


class Algorithm(Protocol):
    """A collective algorithm: the ops it implements and its expansion into channels."""

    name: str
    ops: frozenset[str]

    def segments(self, call: CollectiveCall, topo: object) -> list[list[Segment]]: ...

    def channels(self, call: CollectiveCall, topo: object) -> list[Channel]: ...


class SegmentAlgorithm:
    """Base of the algorithms: ``channels`` is derived from ``segments`` (one description)."""

    def channels(self, call: CollectiveCall, topo) -> list[Channel]:
        return [expand(channel) for channel in self.segments(call, topo)]


def one_step_each(steps: Channel) -> list[Segment]:
    """Segments of an algorithm whose steps all differ (each repeated once)."""
    return [(sends, recvs, 1) for sends, recvs in steps]


def expand(segments: list[Segment]) -> Channel:
    """The steps of one channel, in order."""
    for sends, recvs, repeat in segments:
        for _ in range(repeat):
            yield sends, recvs


_PER_GROUP: dict[tuple, tuple] = {}


def per_group(kind: str, ranks: tuple[int, ...], topo, build):
    """``build(ranks, topo)``, computed once per group: every member of a 3072-rank group asks for
    the same layout, which is O(n) to build (O(n^2) over the members otherwise)."""
    key = (kind, id(ranks), id(topo))
    hit = _PER_GROUP.get(key)
    if hit is not None and hit[0] is ranks and hit[1] is topo:
        return hit[2]
    value = build(ranks, topo)
    if len(_PER_GROUP) >= 256:
        _PER_GROUP.clear()
    _PER_GROUP[key] = (ranks, topo, value)
    return value


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
