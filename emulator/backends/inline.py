"""The in-process backend: N shards in this process (N = 1 by default), driven by the same round
protocol as the Ray backend. ``--shards N`` here proves sharding does not change results."""

from __future__ import annotations

from emulator.engine.coordinator import plan_shards, run_rounds
from emulator.engine.shard import Shard
from emulator.programs import resolve_program
from emulator.summary import RunResult, export_shard, merge


def run_inline(config, topo, shards: int = 1, progress=None, progress_window_ns: float = 1e7, program=None,
               args=None) -> RunResult:  # fmt: skip
    """Run ``config`` (or an explicit ``program``) on ``shards`` in-process shards."""
    if program is None:
        program, args = resolve_program(config)
    plan = plan_shards(topo.num_nodes, shards)
    rank_shard = [0] * topo.world_size
    shard_ranks = []
    for index, nodes in enumerate(plan):
        ranks = [r for n in nodes for r in range(topo.node_first_rank[n], topo.node_first_rank[n] + topo.node_gpus[n])]
        shard_ranks.append(ranks)
        for r in ranks:
            rank_shard[r] = index
    objs = [Shard(topo, ranks, rank_shard, i, program, config, args) for i, ranks in enumerate(shard_ranks)]
    for shard in objs:
        shard.start()
    crossing = [0]

    class Counting:
        """Counts cross-shard records as they are exchanged."""

        def __init__(self, shard):
            self.shard = shard

        def next_time(self):
            return self.shard.next_time()

        def run_until(self, horizon):
            out = self.shard.run_until(horizon)
            crossing[0] += sum(len(v) for v in out.values())
            return out

        def deliver(self, records):
            self.shard.deliver(records)

    rounds = run_rounds([Counting(s) for s in objs], topo.min_cross_node_latency_ns(), progress, progress_window_ns)
    from emulator.engine.diagnose import raise_for_stuck

    raise_for_stuck([b for s in objs for b in s.blocked()])
    return merge(topo.world_size, [export_shard(s) for s in objs], rounds, crossing[0])
