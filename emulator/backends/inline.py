"""The in-process backend: N shards in this process (N = 1 by default), driven by the same round
protocol as the Ray backend. ``--shards N`` here shows that sharding does not change results."""

from __future__ import annotations

from emulator.engine.coordinator import Observer, drive, first_error
from emulator.engine.folding import fold_factor
from emulator.engine.gc_tuning import relaxed_gc
from emulator.engine.placement import shard_layout
from emulator.engine.result import RunResult, export_shard
from emulator.engine.settings import EngineSettings
from emulator.engine.shard import Shard
from emulator.errors import EmulatorError
from emulator.workloads.programs import resolve_program


class InlineTransport:
    """Shards as objects of this process; a batch is the list of records itself. ``observed``: whether
    the driver has an observer, the only reader of the shards' live figures at the finish."""

    def __init__(self, shards: list[Shard], world_size: int, observed: bool = True):
        self.objs = shards
        self.shards = len(shards)
        self.world_size = world_size
        self.observed = observed

    def start(self) -> dict:
        return self._each({i: (shard.start, (), False) for i, shard in enumerate(self.objs)})

    def step(self, work: dict) -> dict:
        return self._each({i: (self.objs[i].step, (horizon, inbound), want_stats)
                           for i, (horizon, inbound, want_stats) in work.items()})  # fmt: skip

    def _each(self, calls: dict) -> dict:
        """Every shard's call, in shard order; a run's error on one shard does not stop the others'
        round: the first in event order is raised once all ran (coordinator.first_error)."""
        replies, errors = {}, []
        for i, (call, args, want_stats) in calls.items():
            try:
                replies[i] = self._reply(self.objs[i], call(*args), want_stats)
            except EmulatorError as exc:
                errors.append(exc)
        if errors:
            raise first_error(errors)
        return replies

    @staticmethod
    def _reply(shard: Shard, result: tuple, want_stats: bool) -> tuple:
        next_time, bound, out, busy_s = result
        batches = {dst: (len(recs), min(r[0] for r in recs), recs) for dst, recs in out.items() if recs}
        return next_time, bound, batches, shard.live_stats() if want_stats else None, busy_s

    def finish(self) -> list[tuple[list, dict, dict | None]]:
        # (the live figures walk every rank and link: 0.02 s at the end of the straggler run, for nobody
        # in a run without an observer)
        return [(s.blocked(), export_shard(s), s.live_stats() if self.observed else None) for s in self.objs]

    def salvage(self, lost: set[int]) -> list[dict | None]:
        return [export_shard(s) for s in self.objs]  # in-process: none is ever lost


def run_inline(config, topo, shards: int = 1, observer: Observer | None = None, program=None, args=None,
               trace_ranks=()) -> RunResult:  # fmt: skip
    """Run ``config`` (or an explicit ``program``) on ``shards`` in-process shards."""
    program_is_workload = program is None
    if program is None:
        program, args = resolve_program(config)
    settings = EngineSettings.from_run_config(config)
    layout, rank_shard = shard_layout(topo, shards, settings)
    fold = fold_factor(settings, topo) if program_is_workload else 1
    with relaxed_gc():
        objs = [Shard(topo, ranks, rank_shard, i, program, settings, args, trace_ranks, fold, config)
                for i, ranks in enumerate(layout)]  # fmt: skip
        transport = InlineTransport(objs, topo.world_size, observer is not None)
        return drive(transport, topo.min_cross_node_latency_ns(), observer)
