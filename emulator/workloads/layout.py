"""Where each rank sits in the 4D layout, and its process groups (Megatron-LM rank order).

Ranks are ordered tensor-fastest, then context, then data, then pipeline (Megatron-Core's
``tp-cp-dp-pp``): ``rank = tp + t * (cp + c * (dp + d * pp))``. A tensor group is therefore a run
of ``t`` consecutive ranks (inside a node when t <= GPUs per node), context peers are ``t`` apart,
data-parallel peers ``t * c`` apart, and pipeline stages are blocks of ``t * c * d`` ranks.

The ranks of a context group hold different tokens of the same sequences and the same weights, so
gradients are reduced (and ZeRO shards them) over the data and context ranks together
(:meth:`ParallelLayout.gradient_group`, Megatron's data-parallel group "with CP").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Coordinates:
    tp: int
    dp: int
    pp: int
    cp: int = 0


@dataclass(frozen=True)
class ParallelLayout:
    tensor: int
    data: int
    pipeline: int
    context: int = 1

    @property
    def world_size(self) -> int:
        return self.tensor * self.context * self.data * self.pipeline

    @property
    def stage_size(self) -> int:
        """Ranks of one pipeline stage."""
        return self.tensor * self.context * self.data

    def rank(self, tp: int, dp: int, pp: int, cp: int = 0) -> int:
        return tp + self.tensor * (cp + self.context * (dp + self.data * pp))

    def coords(self, rank: int) -> Coordinates:
        tp = rank % self.tensor
        cp = (rank // self.tensor) % self.context
        dp = (rank // (self.tensor * self.context)) % self.data
        pp = rank // self.stage_size
        return Coordinates(tp, dp, pp, cp)

    def stage_of(self, rank: int) -> int:
        return rank // self.stage_size

    def tensor_group(self, rank: int) -> tuple[int, ...]:
        c = self.coords(rank)
        return tuple(self.rank(t, c.dp, c.pp, c.cp) for t in range(self.tensor))

    def context_group(self, rank: int) -> tuple[int, ...]:
        c = self.coords(rank)
        return tuple(self.rank(c.tp, c.dp, c.pp, k) for k in range(self.context))

    def data_group(self, rank: int) -> tuple[int, ...]:
        """The data-parallel replicas of this rank's tokens (same tensor and context index)."""
        c = self.coords(rank)
        return tuple(self.rank(c.tp, d, c.pp, c.cp) for d in range(self.data))

    def gradient_group(self, rank: int) -> tuple[int, ...]:
        """The ranks holding the same weights: data x context, in rank order; what gradients are
        reduced and ZeRO partitions over."""
        c = self.coords(rank)
        return tuple(self.rank(c.tp, d, c.pp, k) for d in range(self.data) for k in range(self.context))

    def shard_group(self, rank: int, shard: int) -> tuple[int, ...]:
        """ZeRO-3 hybrid sharding: the block of ``shard`` consecutive members of the gradient group
        that this rank's model states are partitioned over."""
        group = self.gradient_group(rank)
        start = group.index(rank) // shard * shard
        return group[start : start + shard]

    def replica_group(self, rank: int, shard: int) -> tuple[int, ...]:
        """The members of the gradient group holding the same shard as this rank (one per block)."""
        group = self.gradient_group(rank)
        return group[group.index(rank) % shard :: shard]

    def expert_coords(self, rank: int, expert: int, expert_tensor: int) -> tuple[int, int, int]:
        """(expert-tensor, expert-parallel, expert-data) index of a rank: Megatron-Core lays the
        experts over each stage's ``t * c * d`` ranks expert-tensor fastest, then expert, then the
        expert weights' data-parallel replicas."""
        local = rank % self.stage_size
        return local % expert_tensor, (local // expert_tensor) % expert, local // (expert_tensor * expert)

    def _expert_rank(self, stage: int, etp: int, ep: int, edp: int, expert: int, expert_tensor: int) -> int:
        return stage * self.stage_size + etp + expert_tensor * (ep + expert * edp)

    def expert_group(self, rank: int, expert: int, expert_tensor: int) -> tuple[int, ...]:
        """The ranks a MoE layer's tokens are dispatched among (all-to-all): one per expert shard."""
        etp, _, edp = self.expert_coords(rank, expert, expert_tensor)
        stage = self.stage_of(rank)
        return tuple(self._expert_rank(stage, etp, k, edp, expert, expert_tensor) for k in range(expert))

    def expert_tensor_group(self, rank: int, expert: int, expert_tensor: int) -> tuple[int, ...]:
        _, ep, edp = self.expert_coords(rank, expert, expert_tensor)
        stage = self.stage_of(rank)
        return tuple(self._expert_rank(stage, k, ep, edp, expert, expert_tensor) for k in range(expert_tensor))

    def expert_data_group(self, rank: int, expert: int, expert_tensor: int) -> tuple[int, ...]:
        """The ranks holding the same expert weights: their gradients are reduced among them."""
        etp, ep, _ = self.expert_coords(rank, expert, expert_tensor)
        stage = self.stage_of(rank)
        replicas = self.stage_size // (expert * expert_tensor)
        return tuple(self._expert_rank(stage, etp, ep, k, expert, expert_tensor) for k in range(replicas))

    def pipeline_group(self, rank: int) -> tuple[int, ...]:
        # rank(tp, dp, p, cp) for p in range(pipeline): the rank's place in its stage, a stage apart
        size = self.stage_size
        return tuple(range(rank % size, self.world_size, size))

    def embedding_group(self, rank: int) -> tuple[int, ...]:
        """First and last stage of this rank's pipeline: they share the tied embedding."""
        group = self.pipeline_group(rank)
        return (group[0], group[-1])


def layout_of(config) -> ParallelLayout:
    p = config.parallel
    return ParallelLayout(p.tensor, p.data, p.pipeline, p.context)
