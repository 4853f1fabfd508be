"""The in-process backend: N shards in this process (N = 1 by default), driven by the same round
protocol as the Ray backend. ``--shards N`` here shows that sharding does not change results."""

from __future__ import annotations

from emulator.engine.coordinator import Observer, plan_shards, run_rounds
from emulator.engine.diagnose import raise_for_stuck
from emulator.engine.folding import fold_factor
from emulator.engine.gc_tuning import relaxed_gc
from emulator.engine.shard import Shard
from emulator.programs import resolve_program
from emulator.summary import RunResult, export_shard, merge


def shard_layout(topo, shards: int) -> tuple[list[list[int]], list[int]]:
    """Ranks of each shard (whole nodes) and the shard of each rank."""
    rank_shard = [0] * topo.world_size
    layout = []
    for index, nodes in enumerate(plan_shards(topo.num_nodes, shards)):
        ranks = [r for n in nodes for r in range(topo.node_first_rank[n], topo.node_first_rank[n] + topo.node_gpus[n])]
        layout.append(ranks)
        for r in ranks:
            rank_shard[r] = index
    return layout, rank_shard


def run_inline(config, topo, shards: int = 1, observer: Observer | None = None, program=None, args=None,
               trace_ranks=()) -> RunResult:  # fmt: skip
    """Run ``config`` (or an explicit ``program``) on ``shards`` in-process shards."""
    program_is_workload = program is None
    if program is None:
        program, args = resolve_program(config)
    layout, rank_shard = shard_layout(topo, shards)
    fold = fold_factor(config, topo) if program_is_workload else 1
    with relaxed_gc():
        objs = [Shard(topo, ranks, rank_shard, i, program, config, args, trace_ranks, fold)
                for i, ranks in enumerate(layout)]  # fmt: skip
        for shard in objs:
            shard.start()
        stats = run_rounds(objs, topo.min_cross_node_latency_ns(), observer)
    raise_for_stuck([b for s in objs for b in s.blocked()])
    return merge(topo.world_size, [export_shard(s) for s in objs], stats.rounds, stats.cross_shard_messages)
