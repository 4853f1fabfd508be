"""Where each rank sits in the 3D layout, and its process groups (Megatron-LM rank order).

Ranks are ordered tensor-fastest, then data, then pipeline: ``rank = tp + t * (dp + d * pp)``. A
tensor group is therefore a run of ``t`` consecutive ranks (inside a node when t <= GPUs per node),
data-parallel peers are ``t`` apart, and pipeline stages are blocks of ``t * d`` ranks.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Coordinates:
    tp: int
    dp: int
    pp: int


@dataclass(frozen=True)
class ParallelLayout:
    tensor: int
    data: int
    pipeline: int

    @property
    def world_size(self) -> int:
        return self.tensor * self.data * self.pipeline

    def rank(self, tp: int, dp: int, pp: int) -> int:
        return tp + self.tensor * (dp + self.data * pp)

    def coords(self, rank: int) -> Coordinates:
        tp = rank % self.tensor
        dp = (rank // self.tensor) % self.data
        pp = rank // (self.tensor * self.data)
        return Coordinates(tp, dp, pp)

    def stage_of(self, rank: int) -> int:
        return rank // (self.tensor * self.data)

    def tensor_group(self, rank: int) -> tuple[int, ...]:
        c = self.coords(rank)
        return tuple(self.rank(t, c.dp, c.pp) for t in range(self.tensor))

    def data_group(self, rank: int) -> tuple[int, ...]:
        c = self.coords(rank)
        return tuple(self.rank(c.tp, d, c.pp) for d in range(self.data))

    def pipeline_group(self, rank: int) -> tuple[int, ...]:
        c = self.coords(rank)
        return tuple(self.rank(c.tp, c.dp, p) for p in range(self.pipeline))

    def embedding_group(self, rank: int) -> tuple[int, ...]:
        """First and last stage of this rank's pipeline: they share the tied embedding."""
        group = self.pipeline_group(rank)
        return (group[0], group[-1])


def layout_of(config) -> ParallelLayout:
    p = config.parallel
    return ParallelLayout(p.tensor, p.data, p.pipeline)
