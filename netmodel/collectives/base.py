"""What a collective algorithm produces: per member, channels of steps of size-only messages.

A *step* is a tuple ``(sends, recvs)``; each send or receive is ``(peer_rank, size_bytes, chan)``.
All sends and receives of a step are issued together when the step starts; the step ends when its
sends have left the sender and its receives have arrived. Steps of one channel run in order;
channels run concurrently (NCCL's channels). ``chan`` is the logical stream a message belongs to,
the same number on both ends, so that messages match however the two members schedule them.

Algorithms are generators so that a 3072-member ring never materialises its 6142 steps per rank.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

Transfer = tuple[int, int, int]  # (peer rank, size_bytes, chan)
Step = tuple[tuple[Transfer, ...], tuple[Transfer, ...]]
Channel = Iterator[Step]

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

    def channels(self, call: CollectiveCall, topo: object) -> list[Channel]: ...


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
