"""Training figures of a run: throughput, TFLOP/s per GPU, MFU, bubble, exposed communication
(also per parallelism dimension).

Model FLOPs count the forward pass of every layer and the logits, times 3 for forward + backward
(for GPT this equals Korthikanti et al. 2022's ``72*B*L*s*h^2*(1 + s/(6h) + V/(12*h*L))``);
hardware FLOPs are what the ranks actually executed, recomputation included. MFU divides the model
FLOP rate by the cluster's peak dense rate at the run's precision.
"""

from __future__ import annotations

from emulator.engine.result import iteration_times_ns
from emulator.hardware.gpus import get_gpu
from emulator.workloads.layout import layout_of
from emulator.workloads.memory import stage_memory
from emulator.workloads.segments import forward_flops_per_microbatch
from emulator.workloads.streams import stream_dimension

PIPELINE_PREFIX = "pp"


def model_flops_per_iteration(config, causal: bool = False) -> float:
    """Model FLOPs of an iteration: three times the forward's (segments.forward_flops_per_microbatch;
    ``causal``: the attention's unmasked half only), recomputation not counted."""
    t = config.training
    microbatches = t.global_batch_size // t.micro_batch_size
    return 3 * forward_flops_per_microbatch(config, causal) * microbatches


def workload_summary(config, result, topo) -> dict:
    iters = iteration_times_ns(result)
    if not iters:
        return {}
    iteration_s = sum(iters) / len(iters) / 1e9
    span_ns = sum(iters)
    t = config.training
    world = result.world_size
    model_flops = model_flops_per_iteration(config)
    hardware_flops = sum(r.flops for r in result.ranks) / len(iters)
    peak = sum(get_gpu(topo.gpu_type(r)).peak_flops_per_s[t.precision] for r in range(world))
    # exposed communication: the compute stream waiting on a communication stream other than the
    # pipeline's; bubble: every other moment of the iteration the compute stream is idle (waiting on
    # a pipeline neighbour, or done early and waiting for the slowest stage to end the iteration)
    bubble = exposed = 0
    by_dimension = {"tensor": 0, "data": 0, "pipeline": 0, "context": 0, "expert": 0}
    for r in result.ranks:
        waits = r.wait_ns.get("compute", {})
        rank_exposed = sum(ns for stream, ns in waits.items() if not stream.startswith(PIPELINE_PREFIX))
        exposed += rank_exposed
        bubble += max(0, span_ns - r.compute_ns - rank_exposed)
        for stream, ns in waits.items():
            dimension = stream_dimension(stream)
            if dimension in by_dimension:
                by_dimension[dimension] += ns
    layout = layout_of(config)
    per_stage_peak: dict[int, int] = {}
    for r in result.ranks:
        stage = layout.stage_of(r.rank)
        per_stage_peak[stage] = max(per_stage_peak.get(stage, 0), r.peak_memory_bytes)
    return {
        "tokens_per_s": t.global_batch_size * t.seq_length / iteration_s,
        "model_flops_per_iteration": model_flops,
        "model_tflops_per_gpu": model_flops / iteration_s / world / 1e12,
        "hardware_tflops_per_gpu": hardware_flops / iteration_s / world / 1e12,
        "mfu": model_flops / iteration_s / peak,
        "bubble_fraction": bubble / world / span_ns,
        "exposed_comm_fraction": exposed / world / span_ns,
        # the compute stream waiting on each dimension's streams; tensor + data is the exposed
        # communication, pipeline (waits on pp.*: transfers and the schedule's bubble) is part of bubble
        "wait_fraction_by_dimension": {d: ns / world / span_ns for d, ns in by_dimension.items()},
        "peak_memory_bytes_by_stage": {str(s): v for s, v in sorted(per_stage_peak.items())},
        "predicted_peak_memory_bytes_by_stage": {
            str(s): stage_memory(config, s).peak_bytes for s in range(config.parallel.pipeline)
        },
    }
