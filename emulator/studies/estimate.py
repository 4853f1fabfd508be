"""Closed-form iteration time of the built-in training workload: about a millisecond a config, no events.

    python -c "from emulator.config.loader import load_config; from emulator.studies.estimate import estimate; \
print(estimate(load_config('configs/runs/megatron-22b-8gpu.yaml')))"

The planner (emulator/studies/plan.py) ranks thousands of parallelisations with this estimate and emulates
only the best few. Each parallelism technique is described once, in its module under
emulator/workloads/, which the emulated program (training.py) runs and this estimate times, so
that the two can only differ in how events interleave, never in what is computed or sent:

- compute: the fused segments of emulator/workloads/segments.py (the layer op lists of
  layer_costs.py through the roofline of emulator/hardware/compute.py), per GPU type;
- tensor parallelism (emulator/workloads/tensor_parallel.py): each collective timed by the closed
  form the engine itself uses for groups inside one node (netmodel/collectives/analytic.py), the
  segments timed as they are launched, with Megatron's overlaps (``segments_time_ns``);
- data parallelism and ZeRO (emulator/workloads/data_parallel.py): a ring over the data-parallel
  group, one tier per call, with NCCL-style channels across nodes as netmodel/collectives/ring.py
  builds them (:func:`ring_collective_ns`), in the gradient buckets the program launches during the
  last microbatch's backward (``data_parallel_tail_ns``) and ZeRO-3's gathers (``zero3_pass_ns``);
- the pipeline (emulator/workloads/pipeline.py): Narayanan et al. 2021 (section 2.2), ``(m*v + p -
  1)`` chunk slots for ``m`` microbatches, ``p`` stages and ``v`` chunks per stage
  (``pipeline_ns``), plus the activation sends of the fill and the drain; stages whose layers take
  different times (uneven ``pipeline_layers``, GPU types) walk the schedule's actions instead
  (``schedule_walk_ns``);
- every stage on its own GPU type and its own tensor group's links (heterogeneous clusters);
- memory: emulator/workloads/memory.py, the model the emulation allocates by.

What it leaves out (where the emulation can differ): contention between concurrent flows on one
link (pipeline sends against data-parallel rings, tensor-parallel collectives against ZeRO gathers
on the same NVLink ports), non-ring algorithms set per tier (timed as rings here), and the
interleaving of the pipeline's drain with the data-parallel buckets beyond the model of
``data_parallel_tail_ns``.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.hardware.gpus import get_gpu
from emulator.workloads import data_parallel as dpar
from emulator.workloads import experts as ex
from emulator.workloads import layer_costs as lc
from emulator.workloads import pipeline as pipe
from emulator.workloads.data_parallel import data_parallel_tail_ns, zero3_pass_ns
from emulator.workloads.layout import layout_of
from emulator.workloads.memory import (
    expert_params_on_rank,
    gpu_type_of_rank,
    params_on_rank,
    stage_memory,
    stepped_params,
    zero3_root_params,
)
from emulator.workloads.metrics import model_flops_per_iteration
from emulator.workloads.pipeline import pipeline_ns, schedule_walk_ns
from emulator.workloads.schedules import schedule_for
from emulator.workloads.segments import layer_shape, model_segments
from emulator.workloads.tensor_parallel import collective_lead_ns, segments_time_ns
from netmodel.collectives.analytic import closed_form
from netmodel.collectives.base import CollectiveCall, ceil_div
from netmodel.collectives.ring import MAX_CHANNELS
from netmodel.topology import Topology

# the schedule walk (pipeline.schedule_walk_ns) visits every action: ~1 us each; past this many a
# candidate takes the closed form of pipeline.pipeline_ns instead, to keep plans of large runs fast
WALK_MAX_ACTIONS = 20_000


@dataclass(frozen=True)
class Estimate:
    """The estimated figures of one config (times of one iteration, in seconds)."""

    iteration_time_s: float
    compute_s: float  # the busiest stage's compute over the iteration (recomputation included)
    bubble_s: float  # pipeline fill and drain, activation sends included
    exposed_comm_s: float  # tensor-parallel waits, ZeRO-3 gathers and the data-parallel tail
    peak_memory_bytes: int  # largest stage peak (emulator/workloads/memory.py)
    fits: bool  # every stage's peak within its GPUs' memory
    mfu: float


def ring_collective_ns(topo: Topology, op: str, size_bytes: int, ranks: tuple[int, ...]) -> int:
    """Uncontended time of a ring all-reduce / reduce-scatter / all-gather over ``ranks``.

    Inside one node: the engine's own closed form (netmodel/collectives/analytic.py), exact.
    Across nodes: netmodel/collectives/ring.py splits the data over ``C = min(NICs, members per
    node)`` rings that leave each node through different NICs; a step moves ``size / (C * n)``
    bytes per ring and is bound by the node-crossing edge (latency of the tier plus the chunk over
    the NIC's share of the path) or by the scale-up port, which carries the node-internal edges of
    every ring: ``C * (k-1)/k`` chunks per member and step for ``k`` members per node.
    """
    n = len(ranks)
    if n <= 1 or size_bytes <= 0:
        return 0
    if op == "all_to_all":
        return all_to_all_ns(topo, size_bytes, ranks)
    nodes = [topo.rank_node[r] for r in ranks]
    first_node = nodes[0]
    su_ports = [topo.su_tx[r] for r in ranks]
    su_bw = min(topo.link_bw[link] for link in su_ports)
    if all(node == first_node for node in nodes):
        call = CollectiveCall(op, size_bytes, ranks, 0)
        return closed_form("ring", call, su_bw, topo.su_latency_ns[first_node])[0]
    per_node = n // len(set(nodes))
    contiguous = all(nodes[i] == nodes[i - 1] or nodes[i] not in nodes[:i] for i in range(1, n))
    channels = 1
    if per_node > 1 and contiguous:
        nics = min(len(topo.nic_tx[node]) for node in set(nodes))
        channels = max(1, min(nics, per_node, MAX_CHANNELS))
    # the slowest node-crossing edge of the ring order
    crossing = [(ranks[i], ranks[(i + 1) % n]) for i in range(n) if nodes[i] != nodes[(i + 1) % n]]
    routes = [topo.route(a, b) for a, b in crossing[:64]]  # rings repeat their edges; 64 tell the story
    bw = min(min(r.up_bw, r.down_bw) for r in routes)
    latency = max(r.latency_ns for r in routes)
    chunk = ceil_div(ceil_div(size_bytes, channels), n)
    step = max(chunk / bw, channels * (per_node - 1) / per_node * chunk / su_bw) if per_node > 1 else chunk / bw
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    return int(steps * (latency + step))


def all_to_all_ns(topo: Topology, size_bytes: int, ranks: tuple[int, ...]) -> int:
    """An uncontended all-to-all of ``size_bytes`` per member (its send buffer): each member sends
    ``size / n`` to every other, at once; bound by the member's scale-up port for its node's peers
    and by its route's bandwidth for the others, plus a latency per peer."""
    n = len(ranks)
    first = ranks[0]
    node = topo.rank_node[first]
    local = sum(1 for r in ranks if topo.rank_node[r] == node) - 1
    remote = [r for r in ranks if topo.rank_node[r] != node]
    chunk = size_bytes / n
    su_bw = topo.link_bw[topo.su_tx[first]]
    ns = local * chunk / su_bw + (local > 0) * topo.su_latency_ns[node]
    if remote:
        route = topo.route(first, remote[0])
        ns = max(ns, len(remote) * chunk / min(route.up_bw, route.down_bw) + route.latency_ns)
    return int(ns)


def p2p_ns(topo: Topology, src: int, dst: int, size_bytes: int) -> int:
    """One uncontended message: ``latency + size / (bandwidth * efficiency)`` on its route."""
    route = topo.route(src, dst)
    return int(route.latency_ns + size_bytes / min(route.up_bw, route.down_bw))


class Estimator:
    """Estimates configs of one cluster; caches what candidates share (segments, collectives).

    ``topo``: the cluster's Topology, built once for every candidate of a plan.
    """

    def __init__(self, topo: Topology):
        self.topo = topo
        self._segments: dict = {}
        self._collectives: dict = {}

    def segments(self, config, gpu_name: str):
        """A stage's segments; in a MoE model those of the busiest expert-parallel rank, which the
        others wait for in every combine all-to-all (experts.py)."""
        load = max(ex.config_loads(config))
        shape = layer_shape(config, load)
        t = config.training
        key = (shape, t.recompute, t.precision, config.model.vocab_size, gpu_name)  # the shape has every knob
        segs = self._segments.get(key)
        if segs is None:
            segs = self._segments[key] = model_segments(config, get_gpu(gpu_name), load)
        return segs

    def collective_ns(self, op: str, size_bytes: int, ranks: tuple[int, ...]) -> int:
        key = (op, size_bytes, ranks)
        ns = self._collectives.get(key)
        if ns is None:
            ns = self._collectives[key] = ring_collective_ns(self.topo, op, size_bytes, ranks)
        return ns

    def group_timers(self, config, layout, first_rank: int):
        """The collectives of the rank's groups: ``(tp_ns, {group name: timer})`` for
        tensor_parallel.segments_time_ns (context ``cp``, experts ``ep`` and ``etp``)."""
        p = config.parallel
        tp_group = layout.tensor_group(first_rank)
        groups = {"cp": layout.context_group(first_rank)}
        if config.model.experts:
            etp = p.expert_tensor or p.tensor
            groups["ep"] = layout.expert_group(first_rank, p.expert, etp)
            groups["etp"] = layout.expert_tensor_group(first_rank, p.expert, etp)

        def tp_ns(op: str, size_bytes: int) -> int:
            return self.collective_ns(op, size_bytes, tp_group)

        def timer(ranks):
            return lambda op, size_bytes: self.collective_ns(op, size_bytes, ranks)

        return tp_ns, {name: timer(ranks) for name, ranks in groups.items()}

    def stage_pass_ns(self, config) -> list[tuple[int, int]]:
        """Per pipeline stage: (one layer's forward + backward, the embedding's or logits' forward +
        backward) for one microbatch, on the stage's GPU type and tensor group; what an uneven
        partition (emulator/studies/plan.py) balances. ``config`` only needs its shape and placement: its
        layers need not divide evenly."""
        p = config.parallel
        layout = layout_of(config)
        passes = []
        for s in range(p.pipeline):
            first_rank = layout.rank(0, 0, s)
            segs = self.segments(config, gpu_type_of_rank(config.cluster, first_rank))
            tp_ns, others = self.group_timers(config, layout, first_rank)
            ends = ([segs.embedding_forward, segs.embedding_backward] if s == 0 else []) + (
                [segs.logits_forward, segs.logits_backward] if s == p.pipeline - 1 else []
            )
            layer = sum(segments_time_ns(part, tp_ns, others)[0] for part in (segs.layer_forward, segs.layer_backward))
            passes.append((layer, sum(segments_time_ns(part, tp_ns)[0] for part in ends)))
        return passes

    def estimate(self, config) -> Estimate:
        """The estimated iteration of a validated RunConfig with a model (see the module docstring)."""
        p, t = config.parallel, config.training
        layout = layout_of(config)
        stages, chunks = p.pipeline, p.virtual_stages
        micro = pipe.microbatches(config)
        shape = layer_shape(config)
        layer_params = lc.layer_params_per_rank(shape)
        grad_bytes = lc.dense_params_per_rank(shape) * dpar.config_grad_bytes(config)  # the experts' apart
        expert_grad_bytes = ex.expert_params_per_rank(shape) * dpar.config_grad_bytes(config)
        expert_replicas = dpar.expert_replicas(config) if config.model.experts else 1
        gather_bytes = dpar.zero3_gather_bytes(layer_params, t.precision)
        bucket_bytes = dpar.bucket_bytes(p.bucket_size_mb)
        reduce_op = dpar.gradient_collective(p.zero_stage)
        replicas, shard = dpar.replicas(config), dpar.shard_size(config)
        zero3 = dpar.gathers_every_layer(p.zero_stage) and shard > 1
        overlapped_gather = dpar.gathers_after_step(p.zero_stage) and replicas > 1 and p.overlap_param_gather
        tied_bytes = pipe.tied_embedding_bytes(config)
        p2p_bytes = pipe.message_bytes(config)

        chunk_ns: list[int] = []  # forward + backward of one microbatch through one chunk, per stage
        forward_ns: list[list[int]] = []  # per stage and chunk: one microbatch's forward
        backward_ns: list[list[int]] = []
        forward_chunk_ns: list[int] = []  # per stage: one microbatch's forward through one chunk's layers
        backward_chunk_ns: list[int] = []
        compute_ns: list[int] = []  # per stage, per iteration
        exposed_ns: list[int] = []  # per stage, per iteration: TP waits and ZeRO-3 gathers
        tails: list[int] = []  # per stage: from its last backward's end to the iteration's end
        memory = [stage_memory(config, s) for s in range(stages)]
        for s in range(stages):
            first_rank = layout.rank(0, 0, s)
            gpu_name = gpu_type_of_rank(config.cluster, first_rank)
            segs = self.segments(config, gpu_name)
            # each stage's own tensor group: on a heterogeneous cluster its node's scale-up links
            tp_ns, others = self.group_timers(config, layout, first_rank)
            dp_group = layout.gradient_group(first_rank)
            chunk_layers = [pipe.layers_of_chunk(config, s, c) for c in range(chunks)]
            layers = max(chunk_layers)
            fwd, fwd_c = segments_time_ns(segs.layer_forward, tp_ns, others)
            bwd, bwd_c = segments_time_ns(segs.layer_backward, tp_ns, others)
            gather = layer_reduce = root_ns = root_c = 0
            if zero3:
                shard_group = layout.shard_group(first_rank, shard)
                # FSDP2's copy-in before each unit's reduce-scatter: compute of the layer's backward
                copy_in = sum(seg[2] for seg in dpar.zero3_copy_in_segments(
                    lc.dense_params_per_rank(shape), get_gpu(gpu_name), t.precision, dpar.config_grad_bytes(config)))
                bwd, bwd_c = bwd + copy_in, bwd_c + copy_in
                # the root unit of this stage: gathered before its first forward, its gradients copied
                # in and reduce-scattered after its backward, each waited for (once per microbatch)
                root_params = zero3_root_params(config, s)
                if root_params:
                    root_c = sum(seg[2] for seg in dpar.zero3_copy_in_segments(
                        root_params, get_gpu(gpu_name), t.precision, dpar.config_grad_bytes(config)))
                    root_grads = root_params * dpar.config_grad_bytes(config)
                    root_ns = root_c + self.collective_ns(
                        "all_gather", root_params * dpar.weight_bytes_per_param(t.precision), shard_group)
                    root_ns += self.collective_ns("reduce_scatter", root_grads, shard_group)
                    if shard < replicas:
                        root_ns += self.collective_ns("all_reduce", root_grads // shard,
                                                      layout.replica_group(first_rank, shard))  # fmt: skip
                gather = self.collective_ns("all_gather", gather_bytes, shard_group)
                # FSDP2: each layer's gradients reduce-scattered after its backward (then all-reduced
                # across the replicas with hybrid sharding), on the stream of the gathers
                layer_reduce = self.collective_ns("reduce_scatter", grad_bytes, shard_group)
                if shard < replicas:
                    layer_reduce += self.collective_ns("all_reduce", grad_bytes // shard,
                                                       layout.replica_group(first_rank, shard))  # fmt: skip
            # the data-parallel group inside the tensor group's node: both on the same scale-up ports
            # (and so are the context group's K/V exchanges when it lies in that node too)
            one_node = replicas > 1 and len({self.topo.rank_node[r] for r in dp_group}) == 1
            shared = p.tensor > 1 and one_node
            gathers_shared = one_node and (p.tensor > 1 or p.context > 1)
            port_groups = {"cp": others["cp"]} if one_node and p.context > 1 else None
            if gather:
                fwd_lead, fwd_tp = (collective_lead_ns(segs.layer_forward, tp_ns, port_groups)
                                    if gathers_shared else (None, 0))  # fmt: skip
                bwd_lead, bwd_tp = (collective_lead_ns(segs.layer_backward, tp_ns, port_groups)
                                    if gathers_shared else (None, 0))  # fmt: skip
                chunk_passes = [(zero3_pass_ns(fwd, gather, n, fwd_lead, fwd_tp),
                                 zero3_pass_ns(bwd, gather + layer_reduce, n, bwd_lead, bwd_tp)
                                 + (layer_reduce if n else 0)) for n in chunk_layers]  # fmt: skip
            else:
                chunk_passes = [(fwd * n, bwd * n) for n in chunk_layers]
            # chunks may differ by a layer (embedding_in_split, loss_in_split): each timed with its
            # own layers; the stage's typical chunk (its most layers) stands for it in the tails
            stage_fwd, stage_bwd = chunk_passes[chunk_layers.index(layers)]
            stage_c = (fwd_c + bwd_c) * sum(chunk_layers)
            extra = extra_c = 0
            # one microbatch through each chunk, forward and backward: the embedding on the first
            # chunk of stage 0, the logits on the last chunk of the last stage
            forward_ns.append([f for f, _ in chunk_passes])
            backward_ns.append([b for _, b in chunk_passes])
            last = stages - 1
            ends_of_model = ((segs.embedding_forward, 0, 0, forward_ns), (segs.embedding_backward, 0, 0, backward_ns),
                             (segs.logits_forward, last, chunks - 1, forward_ns),
                             (segs.logits_backward, last, chunks - 1, backward_ns))  # fmt: skip
            for part, on_stage, chunk, direction in ends_of_model:
                if s == on_stage:
                    ns, c = segments_time_ns(part, tp_ns, others)
                    extra, extra_c = extra + ns, extra_c + c
                    direction[s][chunk] += ns
            if root_ns:
                extra, extra_c = extra + root_ns, extra_c + root_c
                backward_ns[s][0] += root_ns
            per_micro = sum(f + b for f, b in chunk_passes) + extra
            chunk_ns.append(per_micro // chunks)
            forward_chunk_ns.append(stage_fwd)
            backward_chunk_ns.append(stage_bwd)
            compute_ns.append((stage_c + extra_c) * micro)
            exposed_ns.append((per_micro - stage_c - extra_c) * micro)

            def bucket_ns(size: int, dp_group=dp_group) -> int:
                return self.collective_ns(reduce_op, size, dp_group)

            tail = 0
            if replicas > 1 and not zero3:
                if p.overlap_grad_reduce:
                    tail += data_parallel_tail_ns(bwd, layers, stage_bwd, chunks, stages, grad_bytes,
                                                  bucket_bytes, bucket_ns, shared)  # fmt: skip
                else:  # every bucket after the backward, one after the other
                    launched, rest = dpar.gradient_buckets(layers, grad_bytes, bucket_bytes)
                    sizes = [*launched.values(), *([rest] if rest else [])] * chunks
                    tail += sum(bucket_ns(size) for size in sizes)
            if expert_grad_bytes and expert_replicas > 1:
                # each layer's experts reduced over their replicas after its last backward, queued
                # behind the buckets: what the last microbatch's backward does not hide
                etp = p.expert_tensor or p.tensor
                edp = layout.expert_data_group(first_rank, p.expert, etp)
                expert_ns = sum(chunk_layers) * self.collective_ns(reduce_op, expert_grad_bytes, edp)
                tail += max(0, expert_ns - stage_bwd * chunks) if p.overlap_grad_reduce else expert_ns
            if tied_bytes and s in (0, stages - 1):
                tail += self.collective_ns("all_reduce", tied_bytes, layout.embedding_group(first_rank))
            stage_params = params_on_rank(config, s)
            optimizer = dpar.optimizer_step_segments(stepped_params(config, s), get_gpu(gpu_name), t.precision)
            tail += sum(seg[2] for seg in optimizer if seg[0] == "c")
            expert_params = expert_params_on_rank(config, s)
            weight_gather = dpar.weight_gather_bytes(stage_params - expert_params, t.precision)
            if dpar.gathers_after_step(p.zero_stage) and expert_params and expert_replicas > 1:
                tail += self.collective_ns("all_gather", dpar.weight_gather_bytes(expert_params, t.precision), edp)
            if dpar.gathers_after_step(p.zero_stage) and replicas > 1:
                gather_all = self.collective_ns("all_gather", weight_gather, dp_group)
                if overlapped_gather:
                    # bucket by bucket beside the first forward: the first bucket waits, the rest
                    # hide behind the forward's layers unless they take longer
                    buckets = max(1, -(-weight_gather // bucket_bytes))
                    first = gather_all // buckets
                    tail += first + max(0, gather_all - first - stage_fwd * chunks)
                else:
                    tail += gather_all
            tails.append(tail)

        # a message from each stage to the next; the last: to stage 0 (interleaved wrap-around)
        hops = [p2p_ns(self.topo, layout.rank(0, 0, s), layout.rank(0, 0, (s + 1) % stages), p2p_bytes)
                for s in range(stages)] if stages > 1 else [0]  # fmt: skip
        # stages whose layers take different times (uneven layers, different GPU types): walk the
        # schedule; equal ones (the embedding and logits aside) keep the closed form, exact for them
        unequal = len(set(zip(forward_chunk_ns, backward_chunk_ns, strict=True))) > 1
        if unequal and micro * chunks * stages <= WALK_MAX_ACTIONS:
            last_ends = schedule_walk_ns(forward_ns, backward_ns, hops, micro, schedule_for(config))
            ends = [last_ends[s] + tails[s] for s in range(stages)]
        else:
            # activation / gradient sends between neighbouring stages: once per hop in the fill and
            # the drain; in the steady state of 1F1B they hide behind the other direction's compute
            last_backward_end = pipeline_ns(chunk_ns, micro, chunks) + 2 * sum(hops[:-1])
            # stage s ends its last backward before stage 0 by the backwards (and sends) of stages < s
            ends = []
            ahead = 0
            for s in range(stages):
                ends.append(last_backward_end - ahead + tails[s])
                ahead += backward_chunk_ns[s] + (hops[s] if s < stages - 1 else 0)
        iteration_ns = max(ends)
        busiest = max(range(stages), key=lambda s: compute_ns[s])
        exposed = exposed_ns[busiest] + tails[busiest]
        bubble = max(0, iteration_ns - compute_ns[busiest] - exposed)
        peak = max(sm.peak_bytes for sm in memory)
        fits = all(sm.capacity_bytes and sm.peak_bytes <= sm.capacity_bytes for sm in memory)
        peak_flops = sum(get_gpu(g.gpu).peak_flops_per_s[t.precision] * g.nodes * g.gpus_per_node
                         for g in config.cluster.groups())  # fmt: skip
        iteration_s = iteration_ns / 1e9
        return Estimate(
            iteration_time_s=iteration_s,
            compute_s=compute_ns[busiest] / 1e9,
            bubble_s=bubble / 1e9,
            exposed_comm_s=exposed / 1e9,
            peak_memory_bytes=peak,
            fits=fits,
            mfu=model_flops_per_iteration(config) / iteration_s / peak_flops if iteration_s > 0 else 0.0,
        )


def estimate(config, topo: Topology | None = None) -> Estimate:
    """The estimate of one validated RunConfig (builds the cluster's Topology unless given)."""
    return Estimator(topo or Topology(config.cluster)).estimate(config)
