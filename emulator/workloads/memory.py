"""Memory per rank: weights, gradients, optimizer states (ZeRO-partitioned) and activations.

    emulator check configs/runs/gpt3-175b-1024gpu.yaml     # prints this report per stage

Mixed-precision Adam as in Megatron-LM / ZeRO (Rajbhandari et al. 2020): 16-bit weights (2 B per
parameter), fp32 main gradients (4 B; 2 B for fp16), and fp32 master weights + Adam m and v
(12 B). ZeRO stage 1 partitions the optimizer states over the data-parallel group, stage 2 the
gradients too, stage 3 the weights too. Activations per layer follow Korthikanti et al. 2022,
Table 2 (16-bit activations), times the microbatches a schedule keeps in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.hardware.gpus import get_gpu
from emulator.workloads import layer_costs as lc
from emulator.workloads.layout import layout_of
from emulator.workloads.schedules import gpipe, interleaved_one_f_one_b, schedule_for
from emulator.workloads.segments import layer_shape

GiB = 2**30


def activation_bytes_per_layer(config, recompute: str | None = None) -> int:
    """Korthikanti et al. 2022, Table 2 (``s*b*h*(...)`` bytes for 16-bit activations), for the
    config's recomputation or the one given."""
    m, p, t = config.model, config.parallel, config.training
    recompute = recompute or t.recompute
    s, b, h, a, tp = t.seq_length, t.micro_batch_size, m.hidden_size, m.num_attention_heads, p.tensor
    sp = p.sequence_parallel and tp > 1
    sbh = s * b * h
    if recompute == "full":
        value = 2 * sbh / (tp if sp else 1)  # only the layer input is kept
    elif recompute == "selective":
        value = sbh * 34 / tp if sp else sbh * (10 + 24 / tp)
    elif tp == 1:
        value = sbh * (34 + 5 * a * s / h)
    elif sp:
        value = sbh * (34 / tp + 5 * a * s / (h * tp))
    else:
        value = sbh * (10 + 24 / tp + 5 * a * s / (h * tp))
    scale = 2 if t.precision == "fp32" else 1  # the table counts 16-bit activations
    return int(value * scale)


def layers_of_stage(config, stage: int) -> int:
    """Layers per model chunk on pipeline stage ``stage``."""
    p = config.parallel
    if p.pipeline_layers is not None:
        return p.pipeline_layers[stage]
    return config.model.num_layers // (p.pipeline * p.virtual_stages)


def params_on_rank(config, stage: int) -> int:
    """Parameters one rank of ``stage`` holds (before ZeRO-3 partitioning)."""
    m, p = config.model, config.parallel
    shape = layer_shape(config)
    count = layers_of_stage(config, stage) * p.virtual_stages * lc.layer_params_per_rank(shape)
    vocab = -(-m.vocab_size // p.tensor) * m.hidden_size
    if stage == 0:
        count += vocab + (config.training.seq_length * m.hidden_size if m.position_embedding == "learned" else 0)
    if stage == p.pipeline - 1 and (p.pipeline > 1 or not m.tie_embeddings):
        count += vocab  # the output layer (a copy of the tied embedding on the last stage)
    return count


def logits_bytes(config) -> int:
    """fp32 logits of one microbatch on the last stage (Megatron keeps them for the loss)."""
    t = config.training
    return 4 * t.micro_batch_size * t.seq_length * -(-config.model.vocab_size // config.parallel.tensor)


@dataclass
class StageMemory:
    stage: int
    gpu: str
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activation_bytes_per_chunk: int
    microbatches_in_flight: int
    activations_peak_bytes: int
    transient_bytes: int
    capacity_bytes: int

    @property
    def static_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def peak_bytes(self) -> int:
        return self.static_bytes + self.activations_peak_bytes + self.transient_bytes


def static_bytes(config, stage: int) -> tuple[int, int, int]:
    """(weights, gradients, optimizer states) bytes on one rank of ``stage``."""
    precision, zero, dp = config.training.precision, config.parallel.zero_stage, config.parallel.data
    n = params_on_rank(config, stage)
    weight_b = 4 if precision == "fp32" else 2
    grad_b = 2 if precision == "fp16" else 4
    opt_b = 8 if precision == "fp32" else 12
    weights = n * weight_b // (dp if zero >= 3 else 1)
    grads = n * grad_b // (dp if zero >= 2 else 1)
    optimizer = n * opt_b // (dp if zero >= 1 else 1)
    return weights, grads, optimizer


def gpu_type_of_rank(cluster, rank: int) -> str:
    """The GPU type of a rank, from the node groups (no topology needed); "?" past the cluster."""
    for group in cluster.groups():
        size = group.nodes * group.gpus_per_node
        if rank < size:
            return group.gpu
        rank -= size
    return "?"


def in_flight(config, stage: int) -> tuple[int, int]:
    """(model chunks, last-chunk microbatches) whose activations stage ``stage`` holds at its peak.

    Closed forms of the schedules in emulator/workloads/schedules.py (tests/emulator/test_limits.py
    checks them against walking the schedules), so that ``emulator check`` costs the same for 10
    microbatches as for 65,536: GPipe holds every microbatch; 1F1B and interleaved 1F1B hold their
    warm-up forwards plus one. The second figure counts the chunks that also hold fp32 logits on
    the last stage: all of them under GPipe (or when the warm-up covers every microbatch), else one.
    """
    p = config.parallel
    micro = config.training.global_batch_size // (config.training.micro_batch_size * p.data)
    schedule = schedule_for(config)
    stages, chunks = p.pipeline, p.virtual_stages
    total = micro * chunks
    if schedule is gpipe:
        warmup = total
    elif schedule is interleaved_one_f_one_b:
        warmup = min((stages - stage - 1) * 2 + (chunks - 1) * stages, total)
    else:
        warmup = min(stages - stage - 1, micro)
    peak = min(warmup + 1, total)
    return peak, (micro if warmup >= total else min(1, micro))


def stage_memory(config, stage: int) -> StageMemory:
    p = config.parallel
    layout = layout_of(config)
    gpu = gpu_type_of_rank(config.cluster, layout.rank(0, 0, stage))
    weights, grads, optimizer = static_bytes(config, stage)
    per_chunk = activation_bytes_per_layer(config) * layers_of_stage(config, stage)
    chunks_live, logits_live = in_flight(config, stage)
    peak = per_chunk * chunks_live + (logits_bytes(config) * logits_live if stage == p.pipeline - 1 else 0)
    transient = 0
    if config.training.recompute == "full":  # one layer's activations are rebuilt during its backward
        transient = activation_bytes_per_layer(config, "none")
    return StageMemory(stage, gpu, weights, grads, optimizer, per_chunk, chunks_live, peak, transient,
                       get_gpu(gpu).hbm_bytes if gpu != "?" else 0)  # fmt: skip


def memory_report(config) -> str:
    """A table of memory per pipeline stage, flagging stages that do not fit."""
    lines = [f"{'stage':>5} {'gpu':>15} {'weights':>9} {'grads':>9} {'optim':>9} {'activ.':>9} {'in flight':>9} "
             f"{'peak GiB':>9} {'capacity':>9}"]  # fmt: skip
    for stage in range(config.parallel.pipeline):
        m = stage_memory(config, stage)
        flag = "  OUT OF MEMORY" if m.capacity_bytes and m.peak_bytes > m.capacity_bytes else ""
        lines.append(
            f"{stage:>5} {m.gpu:>15} {m.params_bytes / GiB:>9.2f} {m.grads_bytes / GiB:>9.2f} "
            f"{m.optimizer_bytes / GiB:>9.2f} {m.activations_peak_bytes / GiB:>9.2f} {m.microbatches_in_flight:>9} "
            f"{m.peak_bytes / GiB:>9.2f} {m.capacity_bytes / GiB:>9.2f}{flag}"
        )
    return "\n".join(lines)
