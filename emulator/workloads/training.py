"""The built-in training workload: a Megatron-LM style program for every rank.

    emulator run configs/runs/gpt3-175b-1024gpu.yaml

Each rank runs its pipeline stage's schedule (GPipe, 1F1B or interleaved 1F1B). Per microbatch it
receives activations (or gradients) from its pipeline neighbour, runs its layers' fused compute
segments with the tensor-parallel collectives between them, and sends the result on. During the
backward pass of the last microbatch, gradients are reduced over the data-parallel group in
buckets while the rest of the backward still runs (all-reduce, or reduce-scatter with ZeRO >= 1);
then the optimizer steps over the rank's shard and ZeRO 1-2 all-gather the updated weights. ZeRO-3
gathers every layer's weights before its forward and backward (one layer ahead).

What each technique sends, holds and in which order comes from its module, shared with the
closed-form estimate and the planner: pipeline.py (schedules, stages, messages), data_parallel.py
(gradient buckets, ZeRO gathers and partitions), tensor_parallel.py (the tensor group's collectives
and how segments launch them).

Streams: ``compute``; ``tp`` (tensor-parallel collectives); ``dp`` (gradient buckets, weight
gathers, tied embeddings); ``pp.*`` (pipeline sends and receives, one stream per direction and model
chunk so that a pending receive never blocks another). Waiting on ``pp.*`` is pipeline bubble;
waiting on ``tp``/``dp`` is exposed communication.
"""

from __future__ import annotations

from emulator.workloads import data_parallel as dpar
from emulator.workloads import layer_costs as lc
from emulator.workloads import pipeline as pipe
from emulator.workloads.layout import layout_of
from emulator.workloads.memory import logits_bytes, params_on_rank, static_bytes
from emulator.workloads.schedules import schedule_for
from emulator.workloads.segments import layer_shape, model_segments
from emulator.workloads.tensor_parallel import activation_bytes_per_layer, launch_segments


def training_program(config):
    """Build the per-rank program for a config with a ``model`` (called once per shard)."""
    layout = layout_of(config)
    schedule = schedule_for(config)
    p, t = config.parallel, config.training
    micro = pipe.microbatches(config)
    shape = layer_shape(config)
    p2p_bytes = pipe.message_bytes(config)
    layer_grad_bytes = lc.layer_params_per_rank(shape) * dpar.grad_bytes_per_param(t.precision)
    layer_gather_bytes = dpar.zero3_gather_bytes(lc.layer_params_per_rank(shape), t.precision, p.data)
    bucket_bytes = dpar.bucket_bytes(p.bucket_size_mb)
    reduce_op = dpar.gradient_collective(p.zero_stage)
    tied_bytes = pipe.tied_embedding_bytes(config)
    act_layer = activation_bytes_per_layer(config)
    # with full recomputation one layer's activations are rebuilt during its backward
    full_layer = activation_bytes_per_layer(config, "none") if t.recompute == "full" else 0
    segments_by_gpu: dict[str, object] = {}

    def program(gpu) -> None:
        rank = gpu.rank
        stage = layout.stage_of(rank)
        chunks = p.virtual_stages
        segs = segments_by_gpu.get(gpu.gpu_type)
        if segs is None:
            segs = segments_by_gpu[gpu.gpu_type] = model_segments(config, gpu.spec)
        tp_group = gpu.new_group(layout.tensor_group(rank)) if p.tensor > 1 else None
        dp_group = gpu.new_group(layout.data_group(rank)) if p.data > 1 else None
        pp_ranks = layout.pipeline_group(rank)
        n_layers = pipe.layers_of_stage(config, stage)
        last_stage = p.pipeline - 1
        stage_params = params_on_rank(config, stage)
        optimizer_segments = dpar.optimizer_step_segments(stage_params, p.zero_stage, p.data, gpu.spec, t.precision)
        # the gradient buckets of one chunk's backward: after which layers, and the rest at its end
        buckets_after, buckets_rest = dpar.gradient_buckets(n_layers, layer_grad_bytes, bucket_bytes)

        weights, grads, optimizer = static_bytes(config, stage)
        gpu.alloc(weights, f"stage{stage}.weights")
        gpu.alloc(grads, f"stage{stage}.gradients")
        gpu.alloc(optimizer, f"stage{stage}.optimizer_states")

        def run_segments(segments, suffix: str) -> None:
            launch_segments(gpu, segments, tp_group, suffix)

        def zero3_gathers(layers: int):
            """Launch weight all-gathers one layer ahead; yields before each layer's compute."""
            if not dpar.gathers_every_layer(p.zero_stage) or dp_group is None:
                for _ in range(layers):
                    yield
                return
            ahead = gpu.all_gather(layer_gather_bytes, dp_group, async_op=True, stream="dp")
            for i in range(layers):
                current = ahead
                if i + 1 < layers:
                    ahead = gpu.all_gather(layer_gather_bytes, dp_group, async_op=True, stream="dp")
                current.wait()
                yield

        def neighbour(chunk: int, forward: bool) -> tuple[int, int]:
            """(rank, chunk) of the virtual stage this one sends to (forward) or sends gradients to."""
            dst_stage, dst_chunk = pipe.send_target(stage, chunk, forward, p.pipeline, chunks)
            return pp_ranks[dst_stage], dst_chunk

        activations: dict[tuple[int, int], object] = {}
        buckets: list = []

        def forward(mb: int, chunk: int) -> None:
            first = stage == 0 and chunk == 0
            final = stage == last_stage and chunk == chunks - 1
            if not first:
                src = pp_ranks[pipe.receive_source(stage, True, p.pipeline)]
                gpu.recv(src, p2p_bytes, tag=chunk, async_op=True, stream=f"pp.recv.fwd{chunk}").wait()
            size = act_layer * n_layers + (logits_bytes(config) if final else 0)
            activations[(mb, chunk)] = gpu.alloc(size, f"stage{stage}.activations.mb{mb}.chunk{chunk}")
            suffix = f" mb{mb}"
            if first:
                run_segments(segs.embedding_forward, suffix)
            for _ in zero3_gathers(n_layers):
                run_segments(segs.layer_forward, suffix)
            if final:
                run_segments(segs.logits_forward, suffix)
            else:
                dst, dst_chunk = neighbour(chunk, True)
                gpu.send(dst, p2p_bytes, tag=dst_chunk, async_op=True, stream="pp.send.fwd")

        def backward(mb: int, chunk: int) -> None:
            first = stage == 0 and chunk == 0
            final = stage == last_stage and chunk == chunks - 1
            if not final:
                src = pp_ranks[pipe.receive_source(stage, False, p.pipeline)]
                gpu.recv(src, p2p_bytes, tag=1000 + chunk, async_op=True, stream=f"pp.recv.bwd{chunk}").wait()
            suffix = f" mb{mb}"
            reduce_now = mb == micro - 1 and dp_group is not None
            if final:
                run_segments(segs.logits_backward, suffix)
            for layer, _ in enumerate(zero3_gathers(n_layers)):
                rebuilt = gpu.alloc(full_layer, f"stage{stage}.recomputed_layer") if full_layer else None
                run_segments(segs.layer_backward, suffix)
                if rebuilt is not None:
                    gpu.free(rebuilt)
                if reduce_now and layer in buckets_after:
                    buckets.append(reduce_grads(buckets_after[layer]))
            if first:
                run_segments(segs.embedding_backward, suffix)
            if reduce_now and buckets_rest:
                buckets.append(reduce_grads(buckets_rest))
            gpu.free(activations.pop((mb, chunk)))
            if not first:
                dst, dst_chunk = neighbour(chunk, False)
                gpu.send(dst, p2p_bytes, tag=1000 + dst_chunk, async_op=True, stream="pp.send.bwd")

        def reduce_grads(size: int):
            return getattr(gpu, reduce_op)(size, dp_group, async_op=True, stream="dp")

        actions = schedule(stage, p.pipeline, micro, chunks)
        for _ in range(t.iterations):
            for is_forward, mb, chunk in actions:
                if is_forward:
                    forward(mb, chunk)
                else:
                    backward(mb, chunk)
            for handle in buckets:
                handle.wait()
            buckets.clear()
            if tied_bytes and stage in (0, last_stage):
                embedding = gpu.new_group(layout.embedding_group(rank))
                gpu.all_reduce(tied_bytes, embedding, stream="dp")
            run_segments(optimizer_segments, "")
            if dpar.gathers_after_step(p.zero_stage) and dp_group is not None:
                gpu.all_gather(dpar.weight_gather_bytes(stage_params, t.precision), dp_group, stream="dp")
            gpu.mark_iteration()

    return program
