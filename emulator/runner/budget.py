"""What a run will cost before it starts: host memory and events, from the config alone.

    emulator check configs/runs/gpt3-175b-1024gpu.yaml     # prints this estimate

The estimate is an order of magnitude, meant to refuse in one line what cannot work on this
machine (a run needing terabytes of host memory) instead of swapping or being killed an hour in.
It is conservative: the per-item figures are a few times what was measured, so that a run that
fits by the estimate fits in practice.

Calibration (inline backend, Python 3.12, one process; RSS from ``/usr/bin/time -f %M``):

- a bare run costs ~100-160 MB (interpreter, numpy, numba, the engine); ``BASE_BYTES`` = 256 MiB;
- the built-in workload costs ~87 kB per virtual GPU (megatron-22b, tensor 8 x pipeline n, folding
  off: 162 MB at 16 GPUs, 172 MB at 128); ``PER_VGPU_BYTES_TRAINING`` = 256 kiB, which also covers
  a full queue of ``max_ops_ahead`` = 256 pending ops;
- a user program's virtual GPU costs ~8.5 kB (ping-pong: 110 MB at 1,024 GPUs, 136 MB at 4,096);
  ``PER_VGPU_BYTES_PROGRAM`` = 64 kiB (a program may keep more state; only it knows);
- results per rank (one row, the iteration marks) and per link (five counters and a name).

Events of the built-in workload: every op a rank issues (compute segments, tensor-parallel
collectives, pipeline sends and receives, gradient buckets) is ~``EVENTS_PER_OP`` events, and a
collective whose group spans nodes runs message by message: ~``EVENTS_PER_MESSAGE_STEP`` events per
member and ring step, 2(n-1) steps for n members. Measured: bloom-560m ZeRO-2, 1 iteration, 1.6 M
events at 64 GPUs and 26 M at 256 (estimate 2.0 M and 32 M); megatron-22b tensor 8 x pipeline 16,
161 k events (estimate 0.75 M); llama3-8b-64gpu 0.93 M (estimate 13 M). User programs: events
unknown (None). About 1 M events per second of wall time inline (``EVENTS_PER_S``).
"""

from __future__ import annotations

import math
import os
import types
from dataclasses import dataclass

from emulator.errors import ConfigError

MiB = 1 << 20
BASE_BYTES = 256 * MiB
PER_VGPU_BYTES_TRAINING = 256 << 10
PER_VGPU_BYTES_PROGRAM = 64 << 10
PER_RANK_RESULT_BYTES = 2 << 10  # its RankResult row, waits per stream, folded copies included
PER_MARK_BYTES = 48  # a Python int in a list, per iteration and rank
PER_LINK_BYTES = 512  # five counters in lists and the link's name
PER_TRACE_RECORD_BYTES = 256  # (stream, name, kind, start, end) of one op of a traced rank
EVENTS_PER_OP = 4
EVENTS_PER_MESSAGE_STEP = 8
EVENTS_PER_S = 1_000_000


@dataclass
class Budget:
    """What a run is estimated to need (see the module docstring for how, and how conservative)."""

    world_size: int
    virtual_gpus: int  # ranks the engine runs (fewer than world_size under tensor folding)
    host_memory_bytes: int
    events: int | None  # None: a user program, whose events only running it tells
    ops_per_rank: int | None  # ops one rank issues over the whole run (built-in workload)
    traced_ranks: int = 0  # ranks assumed to record a trace (their ops count in host_memory_bytes)

    @property
    def wall_time_s(self) -> float | None:
        """Inline wall time at ``EVENTS_PER_S``; an order of magnitude."""
        return None if self.events is None else self.events / EVENTS_PER_S

    def describe(self) -> str:
        """One line for ``emulator check``."""
        text = f"estimate: ~{human_bytes(self.host_memory_bytes)} of host memory"
        if self.virtual_gpus != self.world_size:
            text += f" ({self.virtual_gpus} virtual GPUs for {self.world_size} ranks, tensor groups folded)"
        if self.events is None:
            return text + "; events: unknown for a user program"
        return text + f", ~{self.events:.2g} events ({human_seconds(self.wall_time_s)} inline)"


def human_bytes(n: float) -> str:
    """``2.1 TB``-style, decimal units as ``free -h --si`` and disk vendors write them."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def human_seconds(s: float) -> str:
    """An order of magnitude of a duration: ``~40 s``, ``~3 h``, ``<1 s``."""
    if s < 1:
        return "<1 s"
    if s < 120:
        return f"~{s:.0f} s"
    if s < 7200:
        return f"~{s / 60:.0f} min"
    if s < 2 * 86400:
        return f"~{s / 3600:.0f} h"
    return f"~{s / 86400:.0f} days"


def _links(cluster) -> int:
    """Links of the topology (netmodel/topology.py): two scale-up per GPU, two per NIC, and two
    uplink shares per NIC and tier above the first."""
    above = max(0, len(cluster.tiers) - 1)
    return sum(g.nodes * (2 * g.gpus_per_node + g.nic.count * 2 * (1 + above)) for g in cluster.groups())


def _fold(config) -> int:
    from emulator.engine.folding import fold_factor
    from emulator.engine.settings import EngineSettings

    # fold_factor reads only the node groups of the topology: no need to build one
    return fold_factor(EngineSettings.from_run_config(config), types.SimpleNamespace(groups=config.cluster.groups()))


def _training_ops_and_events(config, fold: int) -> tuple[int, int]:
    """(ops one rank issues over the run, events of the whole run) for the built-in workload."""
    from emulator.hardware.gpus import get_gpu
    from emulator.workloads import layer_costs as lc
    from emulator.workloads.pipeline import layers_of_stage, microbatches
    from emulator.workloads.segments import layer_shape, model_segments

    p, t = config.parallel, config.training
    micro = microbatches(config)
    group = config.cluster.groups()[0]
    segs = model_segments(config, get_gpu(group.gpu))
    layers = max(layers_of_stage(config, s) for s in range(p.pipeline))
    per_layer = len(segs.layer_forward) + len(segs.layer_backward)
    per_chunk = layers * per_layer + 4  # + a pipeline receive and send each way
    extra = len(segs.embedding_forward) + len(segs.embedding_backward)
    extra += len(segs.logits_forward) + len(segs.logits_backward)
    grad_bytes = layers * p.virtual_stages * lc.layer_params_per_rank(layer_shape(config)) * 4
    buckets = math.ceil(grad_bytes / (p.bucket_size_mb * MiB)) + 2  # + embedding all-reduce, all-gather
    if p.zero_stage >= 3:  # weight gathers before forward and backward, a reduce-scatter after backward
        buckets += 3 * layers * p.virtual_stages * micro
    ops_per_iteration = micro * p.virtual_stages * per_chunk + extra + buckets + 16  # + optimizer step
    ops = ops_per_iteration * t.iterations
    events = ops * EVENTS_PER_OP * (config.cluster.world_size // fold)
    replicas = p.data * p.context  # gradients are reduced over data x context
    if replicas > 1 and config.cluster.total_nodes > 1:
        # the data-parallel group spans nodes (ranks are tensor-major, data last): ring steps
        steps = 2 * (replicas - 1) * buckets * t.iterations
        events += steps * EVENTS_PER_MESSAGE_STEP * (config.cluster.world_size // fold)
    return ops, events


def estimate(config, traced_ranks: int | None = None) -> Budget:
    """Estimate a run's host memory (bytes) and events; ``traced_ranks`` is how many ranks record a
    trace (default: the first node's GPUs, as ``emulator run``)."""
    cluster = config.cluster
    world = cluster.world_size
    groups = cluster.groups()
    traced = groups[0].gpus_per_node if traced_ranks is None else traced_ranks
    builtin = config.model is not None and config.program is None
    fold = _fold(config) if builtin else 1
    vgpus = world // fold
    ops = events = None
    if builtin:
        ops, events = _training_ops_and_events(config, fold)
        iterations = config.training.iterations
    else:
        iterations = int(config.program_args.get("iterations", 1)) if _is_int(config.program_args) else 1
    memory = BASE_BYTES + vgpus * (PER_VGPU_BYTES_TRAINING if builtin else PER_VGPU_BYTES_PROGRAM)
    memory += world * (PER_RANK_RESULT_BYTES + iterations * PER_MARK_BYTES)
    memory += _links(cluster) * PER_LINK_BYTES
    if ops is not None:
        memory += min(traced, world) * ops * PER_TRACE_RECORD_BYTES
    return Budget(world, vgpus, int(memory), events, ops, min(traced, world))


def _is_int(args: dict) -> bool:
    value = args.get("iterations", 1)
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 10**9


def available_memory_bytes() -> int | None:
    """Memory this machine can give a new process now: MemAvailable of /proc/meminfo (Linux), else
    free physical pages; None where neither is known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def require_fits(config, available_bytes: int | None = None, traced_ranks: int | None = None) -> Budget:
    """Raise ConfigError (one line, the figures) when the run's estimated host memory exceeds
    ``available_bytes`` (default: :func:`available_memory_bytes`); returns the estimate.

    For the inline backend: one process holds every virtual GPU. The Ray backend spreads shards over
    hosts and is not checked here.
    """
    budget = estimate(config, traced_ranks)
    available = available_memory_bytes() if available_bytes is None else available_bytes
    if available is not None and budget.host_memory_bytes > available:
        raise ConfigError(
            f"the run needs ~{human_bytes(budget.host_memory_bytes)} of host memory ({budget.world_size} GPUs"
            + (f", {budget.events:.2g} events" if budget.events is not None else "")
            + f"); this machine has {human_bytes(available)} available; shrink cluster.nodes or "
            "training.iterations, or use --backend ray over several hosts"
        )
    return budget
