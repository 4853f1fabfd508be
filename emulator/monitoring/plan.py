"""What a model run will compute, known before it starts: the yardstick of live progress and MFU.

    emulator run configs/runs/gpt3-175b-1024gpu.yaml --metrics-port 9431

Every shipped run does one iteration, so counting finished iterations says nothing until the end.
The built-in workload (emulator/workloads/training.py) charges, per iteration, each rank the same
compute whatever the timing: every microbatch's forward and backward of each of its model chunks
(embedding on the first virtual stage, logits on the last), then the optimizer step. Summed here
from the same segments the program launches, it is the total the ranks' charged compute time
(``compute_ns``, reported live by every shard) reaches at the end of each iteration: a progress
measure that moves monotonically within an iteration, exact at its end.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.hardware.gpus import get_gpu
from emulator.workloads.data_parallel import optimizer_step_segments
from emulator.workloads.memory import stepped_params
from emulator.workloads.metrics import model_flops_per_iteration
from emulator.workloads.pipeline import layers_of_chunk, microbatches
from emulator.workloads.segments import model_segments


@dataclass(frozen=True)
class WorkPlan:
    """Per iteration of a model run: compute each stage will be charged, model FLOPs, tokens."""

    stage_compute_ns: tuple[int, ...]  # summed over the stage's ranks
    model_flops: float
    tokens: int
    peak_flops_per_s: float  # the cluster's peak dense rate at the run's precision (MFU's yardstick)

    @property
    def compute_ns(self) -> int:
        return sum(self.stage_compute_ns)


def work_plan(config, topo) -> WorkPlan | None:
    """The plan of a run with a ``model`` (the built-in workload); None for a user program."""
    if getattr(config, "model", None) is None:
        return None
    p, t = config.parallel, config.training
    micro = microbatches(config)
    stage_size = topo.world_size // p.pipeline
    per_rank: dict[tuple[int, str], int] = {}
    stage_ns = [0] * p.pipeline
    peak = 0.0
    for rank in range(topo.world_size):
        stage, gpu_type = min(rank // stage_size, p.pipeline - 1), topo.gpu_type(rank)
        key = (stage, gpu_type)
        if key not in per_rank:
            per_rank[key] = _rank_compute_ns(config, stage, get_gpu(gpu_type), micro)
        stage_ns[stage] += per_rank[key]
        peak += get_gpu(gpu_type).peak_flops_per_s[t.precision]
    return WorkPlan(tuple(stage_ns), model_flops_per_iteration(config), t.global_batch_size * t.seq_length, peak)


def _rank_compute_ns(config, stage: int, spec, micro: int) -> int:
    """Compute one rank of ``stage`` is charged per iteration (training.py's program, summed)."""
    p, t = config.parallel, config.training
    segs = model_segments(config, spec)
    chunks, last = p.virtual_stages, p.pipeline - 1
    total = 0
    for chunk in range(chunks):
        layers = layers_of_chunk(config, stage, chunk)
        first, final = stage == 0 and chunk == 0, stage == last and chunk == chunks - 1
        forward = layers * _ns(segs.layer_forward) + first * _ns(segs.embedding_forward)
        backward = layers * _ns(segs.layer_backward) + first * _ns(segs.embedding_backward)
        if final:
            forward += _ns(segs.logits_forward)
            backward += _ns(segs.logits_backward)
        total += micro * (forward + backward)
    return total + _ns(optimizer_step_segments(stepped_params(config, stage), spec, t.precision))


def _ns(segments: list[tuple]) -> int:
    return sum(seg[2] for seg in segments if seg[0] == "c")
