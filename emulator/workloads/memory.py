"""Memory per rank: weights, gradients, optimizer states (ZeRO-partitioned) and activations.

    emulator check configs/runs/gpt3-175b-1024gpu.yaml     # prints this report per stage

The figures of each technique come from its module: the model states per parameter and their ZeRO
partitioning from data_parallel.py (Rajbhandari et al. 2020), the activations per layer and tensor
rank from tensor_parallel.py (Korthikanti et al. 2022, Table 2), the microbatches a schedule keeps
in flight and the layers of each stage from pipeline.py. This module adds them up per stage.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.hardware.gpus import get_gpu
from emulator.workloads import data_parallel as dpar
from emulator.workloads import experts as ex
from emulator.workloads import layer_costs as lc
from emulator.workloads.layout import layout_of
from emulator.workloads.pipeline import in_flight, layers_of_stage, layers_on_stage
from emulator.workloads.segments import layer_shape
from emulator.workloads.tensor_parallel import activation_bytes_per_layer as table2_activation_bytes
from emulator.workloads.tensor_parallel import vocab_rows

GiB = 2**30


def params_on_rank(config, stage: int) -> int:
    """Parameters one rank of ``stage`` holds (before ZeRO-3 partitioning)."""
    m, p = config.model, config.parallel
    shape = layer_shape(config)
    count = layers_on_stage(config, stage) * lc.layer_params_per_rank(shape)
    vocab = vocab_rows(m.vocab_size, p.tensor) * m.hidden_size
    if stage == 0:
        count += vocab + (config.training.seq_length * m.hidden_size if m.position_embedding == "learned" else 0)
    if stage == p.pipeline - 1 and (p.pipeline > 1 or not m.tie_embeddings):
        count += vocab  # the output layer (a copy of the tied embedding on the last stage)
    return count


def expert_params_on_rank(config, stage: int) -> int:
    """The routed experts' parameters among :func:`params_on_rank` (experts.py; 0 for a dense model)."""
    if not config.model.experts:
        return 0  # a dense model (the planner asks for thousands of candidates: no shape to build)
    return layers_on_stage(config, stage) * ex.expert_params_per_rank(layer_shape(config))


def stepped_params(config, stage: int) -> int:
    """Parameters whose optimizer step one rank of ``stage`` runs: its shards from ZeRO 1 on (the
    dense ones over the data x context group, the experts over theirs), else all it holds."""
    p = config.parallel
    experts = expert_params_on_rank(config, stage)
    dense = params_on_rank(config, stage) - experts
    if p.zero_stage < 1:
        return dense + experts
    return dpar.optimizer_params(dense, p.zero_stage, dpar.shard_size(config)) + dpar.optimizer_params(
        experts, p.zero_stage, dpar.expert_replicas(config))


def activation_bytes_per_layer(config, recompute: str | None = None) -> int:
    """Activations one layer keeps per rank and microbatch: Korthikanti's Table 2 terms
    (tensor_parallel.activation_bytes_per_layer), or under torchtitan's per-op checkpointing the
    bytes of what its policy saves (layer_costs.op_selective_saved_bytes)."""
    if (recompute or config.training.recompute) == lc.OP_SELECTIVE:
        return lc.op_selective_saved_bytes(layer_shape(config))
    return table2_activation_bytes(config, recompute)


def logits_bytes(config) -> int:
    """fp32 logits of one microbatch on the last stage (Megatron keeps them for the loss), for the
    rank's own ``s/c`` tokens under context parallelism; with eager kernels the 16-bit logits and
    the fp32 tensors of ``cross_entropy(logits.float())`` at its peak (layer_costs.EAGER_LOSS_FP32_BYTES)."""
    t, p = config.training, config.parallel
    per_logit = dpar.weight_bytes_per_param(t.precision) + lc.EAGER_LOSS_FP32_BYTES if t.kernels == "eager" else 4
    return per_logit * t.micro_batch_size * t.seq_length // p.context * vocab_rows(config.model.vocab_size, p.tensor)


def zero3_root_params(config, stage: int) -> int:
    """The parameters of FSDP2's root unit on ``stage`` (data_parallel.zero3_root_params)."""
    layers = layers_on_stage(config, stage) * lc.layer_params_per_rank(layer_shape(config))
    extra = params_on_rank(config, stage) - layers
    return dpar.zero3_root_params(config, stage, extra)


def zero3_root_bytes(config, stage: int) -> int:
    """What the root unit holds during a microbatch: its gathered 16-bit weights and their 16-bit
    unsharded gradients (FSDP2 computes gradients in the weights' dtype before the reduce-scatter's
    copy-in; counted whole from the start of the backward, where the activations peak)."""
    return 2 * zero3_root_params(config, stage) * dpar.weight_bytes_per_param(config.training.precision)


def rebuilt_layer_bytes(config) -> int:
    """The activations of one layer rebuilt during its backward (full and per-op recomputation): the
    layer's activations without recomputation; 0 otherwise."""
    if config.training.recompute in ("full", "op_selective"):
        return activation_bytes_per_layer(config, "none")
    return 0


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
    """(weights, gradients, optimizer states) bytes on one rank of ``stage`` (data_parallel.py)."""
    p, precision, grad_bytes = config.parallel, config.training.precision, dpar.config_grad_bytes(config)
    experts = expert_params_on_rank(config, stage)
    dense = dpar.model_state_bytes(params_on_rank(config, stage) - experts, precision, p.zero_stage,
                                   dpar.shard_size(config), grad_bytes)  # fmt: skip
    if not experts:
        return dense
    # the experts' states are partitioned over their own data-parallel group (experts.py)
    expert = dpar.model_state_bytes(experts, precision, p.zero_stage, dpar.expert_replicas(config), grad_bytes)
    return dense[0] + expert[0], dense[1] + expert[1], dense[2] + expert[2]


def zero3_buffer_bytes(config) -> int:
    """ZeRO-3's gathered layers and unsharded layer gradients (data_parallel.py); 0 otherwise."""
    if not dpar.gathers_every_layer(config.parallel.zero_stage) or dpar.shard_size(config) < 2:
        return 0
    layer = lc.layer_params_per_rank(layer_shape(config))
    return dpar.zero3_unit_buffers_bytes(layer, config.training.precision, dpar.config_grad_bytes(config))


def gpu_type_of_rank(cluster, rank: int) -> str:
    """The GPU type of a rank, from the node groups (no topology needed); "?" past the cluster."""
    for group in cluster.groups():
        size = group.nodes * group.gpus_per_node
        if rank < size:
            return group.gpu
        rank -= size
    return "?"


def stage_memory(config, stage: int) -> StageMemory:
    p = config.parallel
    layout = layout_of(config)
    gpu = gpu_type_of_rank(config.cluster, layout.rank(0, 0, stage))
    weights, grads, optimizer = static_bytes(config, stage)
    per_chunk = activation_bytes_per_layer(config) * layers_of_stage(config, stage)
    chunks_live, logits_live = in_flight(config, stage)
    peak = per_chunk * chunks_live + (logits_bytes(config) * logits_live if stage == p.pipeline - 1 else 0)
    transient = zero3_buffer_bytes(config) + zero3_root_bytes(config, stage)
    transient += rebuilt_layer_bytes(config)  # one layer's activations rebuilt during its backward
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
