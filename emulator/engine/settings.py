"""What the engine needs of a run, read once from its run config: the engine's only input besides
the topology, the program and its arguments.

    python -c "from emulator.config.loader import load_config; from emulator.engine.settings import EngineSettings; \
print(EngineSettings.from_run_config(load_config('configs/runs/megatron-22b-8gpu.yaml')))"

The run config (emulator/config/schema.py) describes a whole run: cluster, model, training,
faults, engine knobs. The engine (Shard, the GPU handle, folding, placement) reads none of it; the
backends build these settings with :meth:`EngineSettings.from_run_config` once, in the driver,
and pass them in: the in-process backend to its shards, the Ray backend to every shard actor with
the run (so that what the driver's process chose - the ``EMULATOR_TAPE`` mode, :func:`tape_mode` -
is what every shard runs, also on a cluster started elsewhere, ``--address``). A program still
receives the run config itself as ``gpu.config``: the engine carries it to the program without
reading it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from emulator.errors import ConfigError

# how the built-in program's plain pipeline steps run (emulator/engine/tape.py): from tapes with
# their sends and receives in the op kernels, their sends only, their messages in Python ("1": the
# same), or no tapes (the program launches every step itself); ``steps`` fuses a step's kernel calls,
# ``blocks`` also chains a tape's blocks in the kernels, ``arrays`` (the default) also launches a run of
# chained steps in one kernel call; the results are the same
TAPE_MODES = ("kernel", "sends", "python", "1", "0", "steps", "blocks", "arrays")
DEFAULT_TAPE = "arrays"


def tape_mode() -> str:
    """The ``EMULATOR_TAPE`` of this process (``arrays`` when unset), read in the driver into
    :attr:`EngineSettings.tape`; another value is a ConfigError (a typo would measure another mode)."""
    mode = os.environ.get("EMULATOR_TAPE", DEFAULT_TAPE)
    if mode not in TAPE_MODES:
        raise ConfigError(f"EMULATOR_TAPE={mode!r}: expected one of {', '.join(TAPE_MODES)}")
    return mode


@dataclass(frozen=True)
class EngineSettings:
    """The engine's view of a run; fields default to a plain user program's run."""

    max_ops_ahead: int = 256  # how many ops a program may launch ahead of its GPU's streams
    timeline_bucket_ns: int = 1_000_000  # resolution of the bytes-per-tier-over-time record
    collective_engine: str = "compiled"  # "compiled" (netcore.py) or "python" (collective_run.py)
    op_engine: str = "compiled"  # "compiled" (opcore.py, where it applies) or "python" (shard.py)
    # the built-in workload's layer blocks hold no collective but the tensor group's (no context
    # parallelism, no experts): what the compiled per-op engine needs to take them (opcore.py)
    tensor_only_blocks: bool = False
    fast_collectives: bool = True  # groups inside one node complete in closed form
    fold_tensor_groups: bool = True  # allow symmetry folding (folding.py) where it is exact
    precision: str = "bf16"  # the rate a ``gpu.compute(flops=...)`` kernel runs at
    faults: Any = None  # the run's FaultsConfig (emulator/engine/faults.py reads it); None: no faults
    scale_up_tiers: frozenset[str] = frozenset()  # names of the scale-up tiers (a fault window there stops folding)
    # the built-in training workload runs (a model and no user program): folding and placement
    # follow its layout; tensor / data / pipeline are the layout of a model run, 1 without a model
    builtin_workload: bool = False
    tensor: int = 1
    # a MoE model whose experts split over other than the tensor group: its ranks' groups do not
    # shift with the tensor index, so folding (folding.py) is off
    experts_break_symmetry: bool = False
    data: int = 1  # data x context: the ranks of a stage are tensor * data of them
    pipeline: int = 1
    # a run with jobs (emulator/config/jobs.py): per job, its cluster ranks (in job-rank order) and
    # the ranks of one of its pipeline stages (all of them for a job without stages), so that shards
    # keep a job's stages whole; empty without jobs
    jobs: tuple[tuple[tuple[int, ...], int], ...] = ()
    tape: str = DEFAULT_TAPE  # the EMULATOR_TAPE mode (TAPE_MODES) every shard runs: the driver's

    @classmethod
    def from_run_config(cls, config) -> EngineSettings:
        """The settings of a validated RunConfig, and of this process's environment (:func:`tape_mode`)."""
        engine, parallel = config.engine, config.parallel
        model_run = config.model is not None
        return cls(
            max_ops_ahead=engine.max_ops_ahead,
            timeline_bucket_ns=int(engine.timeline_bucket_us * 1000),
            collective_engine=engine.collective_engine,
            op_engine=engine.op_engine,
            tensor_only_blocks=model_run and parallel.context == 1 and config.model.experts == 0,
            fast_collectives=engine.fast_collectives != "none",
            fold_tensor_groups=engine.fold_tensor_groups,
            precision=config.training.precision,
            faults=config.faults,
            scale_up_tiers=frozenset(group.scale_up.name for group in config.cluster.groups()),
            builtin_workload=model_run and config.program is None,
            tensor=parallel.tensor if model_run else 1,
            experts_break_symmetry=model_run and config.model.experts > 0
            and (parallel.expert_tensor or parallel.tensor) != parallel.tensor,
            data=_stage_replicas(parallel) if model_run else 1,
            pipeline=max(1, parallel.pipeline) if model_run else 1,
            jobs=tuple((tuple(job.ranks), _ranks_per_stage(job.run, len(job.ranks))) for job in config.jobs or ()),
            tape=tape_mode(),
        )


def _stage_replicas(parallel):
    """data x context: with tensor, the ranks of a pipeline stage (None while data is not derived)."""
    return parallel.data * parallel.context if parallel.data is not None else None


def _ranks_per_stage(run, ranks: int) -> int:
    """The ranks of one pipeline stage of a job's run (Megatron order: stages are blocks of ranks)."""
    staged = run.model is not None and run.program is None and run.parallel.pipeline >= 2
    return run.parallel.tensor * run.parallel.context * run.parallel.data if staged else ranks
