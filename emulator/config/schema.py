"""The run configuration: ``cluster`` + ``model`` + ``parallel`` / ``training``, plus a program.

Names follow Megatron-LM so that users feel at home (``num_layers``, ``hidden_size``,
``num_attention_heads``, ``ffn_hidden_size``, ``num_query_groups``, ``micro_batch_size`` ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from emulator.config import limits as lim
from emulator.config.cluster import ClusterConfig
from emulator.config.jobs import Slots, resolve_jobs
from emulator.config.typed import require, require_range, shown


@dataclass
class ModelConfig:
    """A decoder-only transformer (GPT/BLOOM style, or Llama style with GQA and SwiGLU)."""

    name: str = "model"
    num_layers: int = 24
    hidden_size: int = 1024
    num_attention_heads: int = 16
    ffn_hidden_size: int | None = None  # default 4 * hidden_size
    vocab_size: int = 51200
    num_query_groups: int | None = None  # grouped-query attention; default = num_attention_heads
    swiglu: bool = False  # gated MLP with three GEMMs (Llama)
    add_bias_linear: bool = True  # GPT/BLOOM have biases; Llama has none
    position_embedding: Literal["learned", "rope", "alibi"] = "learned"  # learned adds s*h parameters
    tie_embeddings: bool = True  # input and output embeddings shared (all-reduced between first and last stage)
    # Megatron's hidden and attention dropout (GPT, BLOOM: masks kept for backward, Korthikanti et al.
    # 2022 Table 2); Llama, Mixtral and DeepSeek train without (false: no masks, no dropout kernels)
    dropout: bool = True
    # mixture of experts (emulator/workloads/experts.py): every layer's MLP is num_experts expert
    # MLPs of moe_ffn_hidden_size (default ffn_hidden_size), each token routed to moe_top_k of them,
    # plus moe_shared_experts MLPs every token passes; at most moe_capacity_factor times the
    # average tokens an expert (dropless when unset)
    num_experts: int | None = None
    moe_top_k: int = 2
    moe_ffn_hidden_size: int | None = None
    moe_shared_experts: int = 0
    moe_capacity_factor: float | None = None

    def validate(self, path: str) -> None:
        require_range(self, path, "num_layers", 1, lim.MAX_NUM_LAYERS)
        require_range(self, path, "num_experts", 1, lim.MAX_EXPERTS)
        require_range(self, path, "moe_top_k", 1, lim.MAX_EXPERTS)
        require_range(self, path, "moe_ffn_hidden_size", 1, lim.MAX_FFN_HIDDEN_SIZE)
        require_range(self, path, "moe_shared_experts", 0, lim.MAX_EXPERTS)
        require_range(self, path, "moe_capacity_factor", lim.MIN_CAPACITY_FACTOR, lim.MAX_CAPACITY_FACTOR)
        if self.num_experts is not None:
            require(
                self.moe_top_k <= self.num_experts,
                f"{path}.moe_top_k ({self.moe_top_k}) must be at most num_experts ({self.num_experts})",
            )
        require_range(self, path, "hidden_size", 1, lim.MAX_HIDDEN_SIZE)
        require_range(self, path, "num_attention_heads", 1, lim.MAX_ATTENTION_HEADS)
        require_range(self, path, "vocab_size", 1, lim.MAX_VOCAB_SIZE)
        require_range(self, path, "ffn_hidden_size", 1, lim.MAX_FFN_HIDDEN_SIZE)
        require_range(self, path, "num_query_groups", 1, lim.MAX_ATTENTION_HEADS)
        require(
            self.hidden_size % self.num_attention_heads == 0,
            f"{path}: hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
            f"({self.num_attention_heads})",
        )
        groups = self.query_groups
        require(
            groups >= 1 and self.num_attention_heads % groups == 0,
            f"{path}.num_query_groups ({groups}) must divide num_attention_heads ({self.num_attention_heads})",
        )

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def experts(self) -> int:
        """Routed experts per MoE layer; 0 for a dense model."""
        return self.num_experts or 0

    @property
    def moe_ffn_size(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_size


@dataclass
class ParallelConfig:
    """How the model is split: tensor x context x pipeline x data = world size (Megatron order,
    context next to tensor: emulator/workloads/layout.py)."""

    tensor: int = 1
    pipeline: int = 1
    data: int | None = None  # default: world size / (tensor * context * pipeline)
    # context parallelism: each rank holds seq_length / context tokens of every sequence; attention
    # exchanges K/V around the context group (emulator/workloads/context_parallel.py)
    context: int = 1
    context_algo: Literal["ring", "all_gather"] = "ring"
    # expert parallelism: a MoE layer's experts split over this many ranks of the data x context
    # group (tokens dispatched and combined by all-to-all), each expert's MLP over expert_tensor
    # ranks (default: tensor); emulator/workloads/experts.py
    expert: int = 1
    expert_tensor: int | None = None
    virtual_stages: int = 1  # model chunks per pipeline rank (interleaved 1F1B when > 1)
    sequence_parallel: bool = False
    zero_stage: int = 0  # 0 (plain data parallel), 1, 2 or 3
    schedule: Literal["1f1b", "gpipe", "interleaved-1f1b"] = "1f1b"
    pipeline_layers: list[int] | None = None  # uneven partition: layers per pipeline stage
    # the embedding and the loss each take one layer's slot of the even split, so the first chunk of
    # stage 0 and the last chunk of the last stage hold one layer fewer (Megatron-Core's
    # --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split; Llama 3 405B)
    embedding_in_split: bool = False
    loss_in_split: bool = False
    bucket_size_mb: float = 40.0  # gradient bucket for data-parallel reduction (Megatron default 40M elems ~)
    # ZeRO-3 hybrid sharding (FSDP2's HSDP): weights, gradients and optimizer states sharded over
    # groups of this many data-parallel ranks and replicated across them; default: the whole group
    zero_shard_group: int | None = None
    # Megatron-Core's distributed data parallel: gradient buckets reduced during the last
    # microbatch's backward (else after it), and ZeRO 1-2's updated weights gathered bucket by
    # bucket during the next forward (else after the optimizer step)
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    # tensor-parallel all-gathers and reduce-scatters pipelined with the GEMMs they feed or drain
    # (Transformer Engine's userbuffers, --tp-comm-overlap); needs sequence parallelism
    tp_comm_overlap: bool = False

    def validate(self, path: str) -> None:
        for key in ("tensor", "pipeline", "data", "context", "zero_shard_group", "expert", "expert_tensor"):
            require_range(self, path, key, 1, lim.MAX_WORLD_SIZE)
        require_range(self, path, "virtual_stages", 1, lim.MAX_VIRTUAL_STAGES)
        require(self.zero_stage in (0, 1, 2, 3), f"{path}.zero_stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        require_range(self, path, "bucket_size_mb", 0, lim.MAX_BUCKET_SIZE_MB, low_open=True)
        if self.pipeline_layers is not None:
            require(
                len(self.pipeline_layers) == self.pipeline,
                f"{path}.pipeline_layers has {len(self.pipeline_layers)} entries but pipeline = {self.pipeline}",
            )
            require(
                all(1 <= n <= lim.MAX_NUM_LAYERS for n in self.pipeline_layers),
                f"{path}.pipeline_layers entries must be in [1, {lim.MAX_NUM_LAYERS}]",
            )


@dataclass
class TrainingConfig:
    """Batch, sequence, recomputation, precision and how many iterations to emulate."""

    micro_batch_size: int = 1
    global_batch_size: int | None = None  # default: micro_batch_size * data
    seq_length: int = 2048
    # "op_selective": torchtitan's per-op selective checkpointing (saves the outputs of every other
    # GEMM without a bias and of the fused attention kernel, reruns the rest; layer_costs.py)
    recompute: Literal["none", "selective", "full", "op_selective"] = "none"
    # "fused": the fused kernels of Megatron-LM / Transformer Engine (or torch.compile); "eager":
    # eager PyTorch, every elementwise op of the model definition its own kernel through HBM and the
    # loss in fp32 (layer_costs.py eager_*)
    kernels: Literal["fused", "eager"] = "fused"
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    iterations: int = 1

    # the dtype gradients are accumulated and reduced in: Megatron's fp32 main gradients, or bf16
    # (NVIDIA's H100 recipes, --grad-reduce-in-bf16); default fp32 (2 B under fp16 precision)
    grad_reduce_dtype: Literal["fp32", "bf16"] | None = None
    # "unfused": Megatron 2022's attention (scores, masked softmax and dropout materialised, the
    # whole s x s square computed); "flash": a fused causal kernel (FlashAttention, cuDNN) that keeps
    # no s x s tensor and skips the masked half (emulator/workloads/layer_costs.py)
    attention: Literal["unfused", "flash"] = "unfused"
    # how unevenly a MoE router spreads tokens: each expert-parallel rank's share of the tokens is
    # a seeded lognormal(0, moe_imbalance) draw, normalised to a mean of 1 (0: perfectly even)
    moe_imbalance: float = 0.0
    seed: int = 0  # the seed of every draw of the training workload (the routing imbalance)

    def validate(self, path: str) -> None:
        require_range(self, path, "micro_batch_size", 1, lim.MAX_MICRO_BATCH_SIZE)
        require_range(self, path, "moe_imbalance", 0, lim.MAX_MOE_IMBALANCE)
        require_range(self, path, "seed", 0, lim.MAX_FAULT_SEED)
        require_range(self, path, "global_batch_size", 1, lim.MAX_GLOBAL_BATCH_SIZE)
        require_range(self, path, "seq_length", 1, lim.MAX_SEQ_LENGTH)
        require_range(self, path, "iterations", 1, lim.MAX_ITERATIONS)


def check_eager_recipes(p, m, t) -> None:
    """training.kernels: eager and recompute: op_selective are modelled as torchtitan's and the
    reference scripts' data-parallel (FSDP) layer: one line naming the key when asked for more."""
    for key, on in (("training.kernels: eager", t.kernels == "eager"),
                    ("training.recompute: op_selective", t.recompute == "op_selective")):  # fmt: skip
        if not on:
            continue
        for name, value in (("parallel.tensor", p.tensor), ("parallel.context", p.context)):
            require(value == 1, f"{key} is modelled without tensor or context parallelism; got {name} = {value}")
        require(not m.experts, f"{key} is modelled for dense models; got model.num_experts = {m.experts}")


@dataclass
class EngineConfig:
    """Engine knobs that change speed, never results."""

    max_ops_ahead: int = 256  # how far a program may run ahead of its GPU's streams
    timeline_bucket_us: float = 1000.0  # resolution of the bytes-per-tier-over-time record
    # "intra_node": collectives of groups inside one node complete in closed form (one event per
    # member instead of 2(n-1) messages); "none": every collective expands into messages (reference)
    fast_collectives: Literal["intra_node", "none"] = "intra_node"
    # the built-in workload on nodes that are exactly one tensor group with a NIC per GPU: run one
    # virtual GPU per tensor group (results identical, events / tensor size; emulator/engine/folding.py)
    fold_tensor_groups: bool = True
    # where message-level collectives run: "compiled" (numba, emulator/engine/netkernels.py) or
    # "python" (the reference implementation); the results are the same bit for bit
    collective_engine: Literal["compiled", "python"] = "compiled"
    # where the built-in workload's op blocks run: "compiled" (numba, emulator/engine/opcore.py: one
    # shard, no faults) or "python" (the reference rules of emulator/engine/shard.py); same results
    op_engine: Literal["compiled", "python"] = "compiled"
    # how the Ray backend runs rounds: "direct" (the shards exchange each round's replies and records
    # over a connection per pair of shards, actors/peer.py; the driver is out of the rounds) or "calls"
    # (one actor call per busy shard and round, through the driver); measured in benchmarks/README.md
    # (a third mode over Ray Compiled Graphs was slower than "direct" and could crash a raylet when a
    # shard died under it: removed)
    ray_rounds: Literal["direct", "calls"] = "direct"

    def validate(self, path: str) -> None:
        require_range(self, path, "max_ops_ahead", 2, lim.MAX_OPS_AHEAD)
        require_range(self, path, "timeline_bucket_us", lim.MIN_TIMELINE_BUCKET_US, lim.MAX_TIMELINE_BUCKET_US)


@dataclass
class SlowGpuFault:
    """Ranks or nodes whose kernels run at ``factor`` of normal speed (each lasts duration / factor),
    for the whole run or for the kernels that start inside ``[start_s, end_s)`` (virtual seconds)."""

    factor: float
    ranks: list[int] | None = None
    nodes: list[int] | None = None
    start_s: float | None = None
    end_s: float | None = None

    def validate(self, path: str) -> None:
        require_range(self, path, "factor", lim.MIN_FAULT_FACTOR, 1)
        require_targets(self, path, required=True)
        require_window(self, path)

    @property
    def windowed(self) -> bool:
        return self.start_s is not None or self.end_s is not None


def require_window(fault, path: str) -> None:
    """A fault's optional time window ``[start_s, end_s)``: within the bounds, end after start."""
    require_range(fault, path, "start_s", 0, lim.MAX_FAULT_TIME_S)
    require_range(fault, path, "end_s", 0, lim.MAX_FAULT_TIME_S)
    if fault.start_s is not None and fault.end_s is not None:
        require(
            fault.end_s > fault.start_s,
            f"{path}: end_s ({fault.end_s:g}) must be after start_s ({fault.start_s:g})",
        )


@dataclass
class JitterFault:
    """Every kernel's duration times a seeded lognormal(0, ``sigma``) factor, drawn per rank in the
    rank's launch order; all ranks unless ``ranks`` or ``nodes`` are given."""

    sigma: float
    ranks: list[int] | None = None
    nodes: list[int] | None = None

    def validate(self, path: str) -> None:
        require_range(self, path, "sigma", 0, lim.MAX_JITTER_SIGMA)
        require_targets(self, path, required=False)


@dataclass
class NicRef:
    """NIC ``index`` of node ``node`` (both directions: its tx and rx links)."""

    node: int
    index: int = 0

    def validate(self, path: str) -> None:
        require_range(self, path, "node", 0, lim.MAX_NODES)
        require_range(self, path, "index", 0, lim.MAX_NICS_PER_NODE)


@dataclass
class SlowLinkFault:
    """Links at ``factor`` of their bandwidth: ``links`` by their ``links.csv`` names, a ``nic`` of a
    node (tx and rx), or a whole ``tier`` (every link of it, both directions); for the whole run, or
    for the bytes they carry inside ``[start_s, end_s)`` (virtual seconds; netmodel/links.py)."""

    factor: float
    links: list[str] | None = None
    nic: NicRef | None = None
    tier: str | None = None
    start_s: float | None = None
    end_s: float | None = None

    def validate(self, path: str) -> None:
        require_range(self, path, "factor", lim.MIN_FAULT_FACTOR, 1)
        chosen = [key for key in ("links", "nic", "tier") if getattr(self, key) is not None]
        require(
            len(chosen) == 1,
            f"{path}: give exactly one of links, nic, tier" + (f" (got {', '.join(chosen)})" if chosen else ""),
        )
        require(self.links != [], f"{path}.links: the list is empty")
        require_window(self, path)


@dataclass
class FailFault:
    """A ``node`` (its GPUs, scale-up ports, NICs and uplink shares), a ``link`` (a ``links.csv``
    name) or a ``nic`` of a node (tx and rx) that goes down at virtual time ``at_s``, for good."""

    at_s: float
    node: int | None = None
    link: str | None = None
    nic: NicRef | None = None

    def validate(self, path: str) -> None:
        chosen = [key for key in ("node", "link", "nic") if getattr(self, key) is not None]
        require(
            len(chosen) == 1,
            f"{path}: give exactly one of node, link, nic" + (f" (got {', '.join(chosen)})" if chosen else ""),
        )
        require_range(self, path, "at_s", 0, lim.MAX_FAULT_TIME_S)
        require_range(self, path, "node", 0, lim.MAX_NODES)


@dataclass
class FaultsConfig:
    """What goes wrong during the run (emulator/engine/faults.py); every random draw derives from ``seed``."""

    seed: int = 0
    slow_gpu: list[SlowGpuFault] = field(default_factory=list)
    jitter: JitterFault | None = None
    slow_link: list[SlowLinkFault] = field(default_factory=list)
    fail: list[FailFault] = field(default_factory=list)
    # when a rank waiting in a collective or a receive whose peer is gone gives up: PyTorch's
    # default process-group timeout for NCCL, 10 minutes (torch.distributed.init_process_group,
    # ``timeout``; the NCCL watchdog aborts the collective that exceeds it)
    collective_timeout_s: float = 600.0

    def validate(self, path: str) -> None:
        require_range(self, path, "seed", 0, lim.MAX_FAULT_SEED)
        require_range(
            self, path, "collective_timeout_s", lim.MIN_COLLECTIVE_TIMEOUT_S, lim.MAX_COLLECTIVE_TIMEOUT_S
        )

    @property
    def active(self) -> bool:
        return bool(
            self.slow_gpu or self.slow_link or self.fail or (self.jitter is not None and self.jitter.sigma > 0)
        )

    def check_cluster(self, cluster: ClusterConfig, path: str = "faults") -> None:
        """Every rank, node, NIC, link and tier named exists in ``cluster``."""
        world, nodes = cluster.world_size, cluster.total_nodes
        targeted = [(f"{path}.slow_gpu[{i}]", f) for i, f in enumerate(self.slow_gpu)]
        if self.jitter is not None:
            targeted.append((f"{path}.jitter", self.jitter))
        for where, fault in targeted:
            for rank in fault.ranks or ():
                require(0 <= rank < world, f"{where}.ranks: rank {rank} is not in the cluster (ranks 0..{world - 1})")
            for node in fault.nodes or ():
                require(0 <= node < nodes, f"{where}.nodes: node {node} is not in the cluster (nodes 0..{nodes - 1})")
        groups = cluster.groups()
        tiers = [g.scale_up.name for g in groups] + [t.name for t in cluster.tiers]
        for i, fault in enumerate(self.slow_link):
            where = f"{path}.slow_link[{i}]"
            if fault.tier is not None:
                require(
                    fault.tier in tiers,
                    f"{where}.tier: unknown tier {shown(fault.tier)}; tiers of this cluster: "
                    f"{', '.join(dict.fromkeys(tiers))}",
                )
            if fault.nic is not None:
                _check_nic(groups, nodes, fault.nic, f"{where}.nic")
            for name in fault.links or ():
                require(
                    _link_exists(cluster, groups, name),
                    f"{where}.links: no link {shown(name)} in this cluster (names as in links.csv: "
                    f"gpu0.{groups[0].scale_up.name}.tx, node0.nic0.rx, ...)",
                )
        for i, fault in enumerate(self.fail):
            where = f"{path}.fail[{i}]"
            if fault.node is not None:
                require(
                    fault.node < nodes, f"{where}.node: node {fault.node} is not in the cluster (nodes 0..{nodes - 1})"
                )
            if fault.nic is not None:
                _check_nic(groups, nodes, fault.nic, f"{where}.nic")
            if fault.link is not None:
                require(
                    _link_exists(cluster, groups, fault.link),
                    f"{where}.link: no link {shown(fault.link)} in this cluster (names as in links.csv: "
                    f"gpu0.{groups[0].scale_up.name}.tx, node0.nic0.rx, ...)",
                )


def check_context(p: ParallelConfig, m: ModelConfig, t: TrainingConfig) -> None:
    """Context parallelism splits every sequence into ``2 * context`` chunks (causal load balancing:
    rank ``i`` holds chunks ``i`` and ``2c-1-i``, Megatron-Core), each further split over the tensor
    group under sequence parallelism."""
    if p.context == 1:
        return
    chunks = 2 * p.context * (p.tensor if p.sequence_parallel and p.tensor > 1 else 1)
    require(
        t.seq_length % chunks == 0,
        f"training.seq_length ({t.seq_length}) must be divisible by 2 * context({p.context})"
        + (f" * tensor({p.tensor}) (sequence parallel)" if chunks != 2 * p.context else "")
        + f" = {chunks}",
    )


def check_experts(p: ParallelConfig, m: ModelConfig) -> None:
    """Expert parallelism needs experts to split, and its groups must tile a pipeline stage."""
    if p.expert_tensor is None:
        p.expert_tensor = p.tensor
    if not m.experts:
        require(p.expert == 1, f"parallel.expert ({p.expert}) needs a model with experts (model.num_experts)")
        return
    require(
        m.experts % p.expert == 0,
        f"parallel.expert ({p.expert}) must divide model.num_experts ({m.experts})",
    )
    require(
        p.tensor % p.expert_tensor == 0,
        f"parallel.expert_tensor ({p.expert_tensor}) must divide parallel.tensor ({p.tensor})",
    )
    stage = p.tensor * p.context * p.data
    require(
        stage % (p.expert * p.expert_tensor) == 0,
        f"parallel: expert({p.expert}) * expert_tensor({p.expert_tensor}) must divide tensor({p.tensor}) * "
        f"context({p.context}) * data({p.data}) = {stage}",
    )
    require(
        m.moe_ffn_size % p.expert_tensor == 0,
        f"model.moe_ffn_hidden_size ({m.moe_ffn_size}) must be divisible by parallel.expert_tensor ({p.expert_tensor})",
    )
    require(p.zero_stage < 3, "zero_stage 3 with experts is not modelled (FSDP of expert weights); use 0-2")


def check_data_parallel_knobs(p: ParallelConfig) -> None:
    """The knobs of data parallelism that need a ZeRO stage or a tensor group to mean anything."""
    if p.zero_shard_group is not None:
        require(p.zero_stage == 3, f"parallel.zero_shard_group needs zero_stage 3, got zero_stage {p.zero_stage}")
        replicas = p.data * p.context
        require(
            replicas % p.zero_shard_group == 0,
            f"parallel.zero_shard_group ({p.zero_shard_group}) must divide data({p.data}) * context({p.context}) "
            f"= {replicas}",
        )
    if p.tp_comm_overlap:
        require(
            p.tensor > 1 and p.sequence_parallel,
            "parallel.tp_comm_overlap needs tensor > 1 and sequence_parallel: true (it pipelines the "
            "all-gathers and reduce-scatters of sequence parallelism with their GEMMs)",
        )


def require_targets(fault, path: str, required: bool) -> None:
    """At most one of ``ranks`` / ``nodes`` (exactly one when ``required``), not empty, no repeats."""
    chosen = [key for key in ("ranks", "nodes") if getattr(fault, key) is not None]
    require(len(chosen) <= 1, f"{path}: give ranks or nodes, not both")
    require(not required or chosen, f"{path}: give the ranks or the nodes it applies to")
    for key in chosen:
        values = getattr(fault, key)
        require(values, f"{path}.{key}: the list is empty")
        require(len(set(values)) == len(values), f"{path}.{key}: {shown(values)} repeats an entry")


def _check_nic(groups: list, nodes: int, nic: NicRef, where: str) -> None:
    node, index = nic.node, nic.index
    require(0 <= node < nodes, f"{where}.node: node {node} is not in the cluster (nodes 0..{nodes - 1})")
    count = _node_group(groups, node).nic.count
    require(index < count, f"{where}.index: node {node} has {count} NICs (0..{count - 1}), got {index}")


def _node_group(groups: list, node: int):
    for group in groups:
        if node < group.nodes:
            return group
        node -= group.nodes
    raise AssertionError("node checked against the cluster first")


_GPU_LINK = re.compile(r"gpu(\d+)\.(.+)\.(tx|rx)")
_NODE_LINK = re.compile(r"node(\d+)\.nic(\d+)\.(.+)")


def _link_exists(cluster: ClusterConfig, groups: list, name: str) -> bool:
    """Whether ``name`` is a link of ``cluster`` (the names of netmodel/topology.py), without
    building the topology: a million-GPU cluster has millions of links."""
    match = _GPU_LINK.fullmatch(name)
    if match:
        rank = int(match.group(1))
        for group in groups:
            size = group.nodes * group.gpus_per_node
            if rank < size:
                return match.group(2) == group.scale_up.name
            rank -= size
        return False
    match = _NODE_LINK.fullmatch(name)
    if not match or int(match.group(1)) >= cluster.total_nodes:
        return False
    if int(match.group(2)) >= _node_group(groups, int(match.group(1))).nic.count:
        return False
    tiers = cluster.tiers
    shares = {f"{a.name}-{b.name}.{d}" for a, b in zip(tiers, tiers[1:], strict=False) for d in ("up", "down")}
    return match.group(3) in {"tx", "rx"} | shares


_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass
class JobConfig:
    """One job of a run with ``jobs:`` (emulator/config/jobs.py): what it runs, as a run file would
    say it, and where: ``nodes`` (whole nodes) or ``gpus``, placed by the run's ``placement``, or
    exactly ``node_ids`` (whole nodes) or ``slots`` (GPUs of nodes). A run file named by ``run:``
    (resolved by the loader) gives the defaults.
    """

    name: str = ""
    nodes: int | None = None
    gpus: int | None = None
    node_ids: list[int] | None = None
    slots: list[Slots] | None = None
    model: ModelConfig | None = None
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    program: str | None = None  # "path.py:function"; default: the built-in training workload
    program_args: dict[str, Any] = field(default_factory=dict)
    # the job's own cluster (its run file's): its GPU types must be those of the GPUs the job gets;
    # the network, node count and node size are the shared cluster's. Its size is the default size.
    cluster: ClusterConfig | None = None

    def validate(self, path: str) -> None:
        require(
            _JOB_NAME.fullmatch(self.name) is not None,
            f"{path}.name: {shown(self.name)} is not a job name (1-64 letters, digits, '.', '_', '-'; it names "
            f"the job's folder of the run directory)",
        )
        where = ("nodes", "gpus", "node_ids", "slots")
        if all(getattr(self, key) is None for key in where) and self.cluster is not None:
            self.gpus = self.cluster.world_size  # the size of its run file's cluster
        chosen = [key for key in where if getattr(self, key) is not None]
        require(len(chosen) == 1, f"{path}: give exactly one of nodes, gpus, node_ids, slots" +
                (f" (got {', '.join(chosen)})" if chosen else ""))  # fmt: skip
        require_range(self, path, "nodes", 1, lim.MAX_NODES)
        require_range(self, path, "gpus", 1, lim.MAX_WORLD_SIZE)
        if self.node_ids is not None:
            require(self.node_ids, f"{path}.node_ids: the list is empty")
            require(len(self.node_ids) <= lim.MAX_NODES, f"{path}.node_ids: more than {lim.MAX_NODES} nodes")
            require(all(n >= 0 for n in self.node_ids), f"{path}.node_ids: node ids are >= 0")
            require(len(set(self.node_ids)) == len(self.node_ids), f"{path}.node_ids: {shown(self.node_ids)} "
                    "repeats a node")  # fmt: skip
        if self.slots is not None:
            require(self.slots, f"{path}.slots: the list is empty")
            require(len(self.slots) <= lim.MAX_NODES, f"{path}.slots: more than {lim.MAX_NODES} entries")


@dataclass
class RunConfig:
    """A run file: what to emulate on which cluster."""

    name: str = "run"
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    model: ModelConfig | None = None
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    program: str | None = None  # "path.py:function"; default: the built-in training workload
    program_args: dict[str, Any] = field(default_factory=dict)
    engine: EngineConfig = field(default_factory=EngineConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)  # stragglers, jitter, slow links
    # several jobs on this cluster in one emulation (emulator/config/jobs.py), each placed by
    # ``placement`` unless it names its node_ids; the top level then runs nothing itself
    jobs: list[JobConfig] | None = None
    placement: Literal["packed", "spread"] = "packed"

    def validate(self, path: str) -> None:
        self.faults.check_cluster(self.cluster)
        # the topology is built from the cluster in several places (the run, each Ray shard, the
        # monitor, the results): the faults travel with the cluster so that every one sees them
        # (netmodel/topology.py applies the slow links; not a field: config.yaml has them once)
        self.cluster.faults = self.faults
        if self.jobs is not None:
            count = len(self.jobs)
            require(count <= lim.MAX_JOBS, f"jobs: {count} jobs; the emulator's limit is {lim.MAX_JOBS}")
            resolve_jobs(self)
            return
        require(
            self.program is not None or self.model is not None,
            "the run needs either 'program: path.py:function' or a 'model' for the built-in training workload",
        )
        if self.program is not None:
            require(":" in self.program, f"program: expected 'path.py:function', got {self.program!r}")
        if self.model is None:
            return
        world = self.cluster.world_size
        p = self.parallel
        model = p.tensor * p.context * p.pipeline
        factors = f"tensor({p.tensor}) * context({p.context}) * pipeline({p.pipeline})"
        if p.data is None:  # derived: say what does not divide rather than show a made-up data(0)
            require(
                world % model == 0,
                f"parallel: world size {world} is not divisible by {factors} = {model}",
            )
        data = p.data if p.data is not None else world // model
        require(
            model * data == world,
            f"parallel: {factors} * data({data}) = {model * data} != world size {world}",
        )
        p.data = data
        m, t = self.model, self.training
        check_context(p, m, t)
        check_eager_recipes(p, m, t)
        check_data_parallel_knobs(p)
        check_experts(p, m)
        require(
            m.num_attention_heads % p.tensor == 0,
            f"parallel.tensor ({p.tensor}) must divide model.num_attention_heads ({m.num_attention_heads})",
        )
        in_split = p.embedding_in_split + p.loss_in_split
        if in_split:
            require(
                p.pipeline_layers is None,
                "parallel.embedding_in_split / loss_in_split apply to the even split; with "
                "parallel.pipeline_layers give the layers per stage instead",
            )
            slots = p.pipeline * p.virtual_stages
            require(
                (m.num_layers + in_split) % slots == 0,
                f"model.num_layers ({m.num_layers}) + {in_split} (embedding_in_split, loss_in_split) must be "
                f"divisible by pipeline({p.pipeline}) * virtual_stages({p.virtual_stages}) = {slots}",
            )
        elif p.pipeline_layers is not None:
            require(
                sum(p.pipeline_layers) * p.virtual_stages == m.num_layers,
                f"parallel.pipeline_layers sum to {sum(p.pipeline_layers)} (x virtual_stages "
                f"{p.virtual_stages}) but model.num_layers = {m.num_layers}",
            )
        else:
            require(
                m.num_layers % (p.pipeline * p.virtual_stages) == 0,
                f"model.num_layers ({m.num_layers}) must be divisible by pipeline({p.pipeline}) * "
                f"virtual_stages({p.virtual_stages}); or give parallel.pipeline_layers",
            )
        if t.global_batch_size is None:
            t.global_batch_size = t.micro_batch_size * data
        require(
            t.global_batch_size % (t.micro_batch_size * data) == 0,
            f"training.global_batch_size ({t.global_batch_size}) must be a multiple of micro_batch_size"
            f"({t.micro_batch_size}) * data({data}) = {t.micro_batch_size * data}",
        )
        micro = t.global_batch_size // (t.micro_batch_size * data)
        require(
            micro <= lim.MAX_MICROBATCHES,
            f"training: {micro} microbatches per iteration (global_batch_size {t.global_batch_size} / "
            f"(micro_batch_size {t.micro_batch_size} * data {data})); the emulator's limit is {lim.MAX_MICROBATCHES}",
        )
        if p.virtual_stages > 1 or p.schedule == "interleaved-1f1b":
            # (without a pipeline the chunks would pass their activations to the rank itself)
            require(
                p.pipeline > 1,
                f"parallel.virtual_stages ({p.virtual_stages}) / the interleaved schedule needs "
                f"parallel.pipeline > 1 (got {p.pipeline})",
            )
            require(
                micro % p.pipeline == 0,
                f"interleaved schedule: microbatches per pipeline ({micro}) must be a multiple of "
                f"pipeline ({p.pipeline})",
            )
