"""The built-in training workload: a Megatron-LM style program for every rank.

    emulator run configs/runs/gpt3-175b-1024gpu.yaml

Each rank runs its pipeline stage's schedule (GPipe, 1F1B or interleaved 1F1B). Per microbatch it
receives activations (or gradients) from its pipeline neighbour, runs its layers' fused compute
segments with the tensor-parallel collectives between them, and sends the result on. During the
backward pass of the last microbatch, gradients are reduced over the data-parallel group in
buckets while the rest of the backward still runs (all-reduce, or reduce-scatter with ZeRO >= 1);
then the optimizer steps over the rank's shard and ZeRO 1-2 all-gather the updated weights. ZeRO-3
gathers every layer's weights before its forward and backward (one layer ahead).

Streams: ``compute``; ``tp`` (tensor-parallel collectives); ``dp`` (gradient buckets, weight
gathers, tied embeddings); ``pp.*`` (pipeline sends and receives, one stream per direction and model
chunk so that a pending receive never blocks another). Waiting on ``pp.*`` is pipeline bubble;
waiting on ``tp``/``dp`` is exposed communication.
"""

from __future__ import annotations

from emulator.workloads import layer_costs as lc
from emulator.workloads.layout import layout_of
from emulator.workloads.memory import (
    activation_bytes_per_layer,
    layers_of_stage,
    logits_bytes,
    params_on_rank,
    static_bytes,
)
from emulator.workloads.schedules import schedule_for
from emulator.workloads.segments import BYTES_PER_ELEMENT, layer_shape, model_segments, to_segments

MiB = 1 << 20


def launch_segments(gpu, segments: list[tuple], tp_group, suffix: str = "") -> None:
    """Launch fused compute segments and the tensor-parallel collectives between them."""
    pending = None
    for seg in segments:
        kind = seg[0]
        if kind == "c":
            gpu.compute(seg[1] + suffix, duration_ns=seg[2], flops=seg[3])
        elif kind == "m":
            if tp_group is None:
                continue
            handle = getattr(gpu, seg[2])(seg[3], tp_group, async_op=True, stream="tp")
            if seg[4]:
                pending = handle  # overlapped: waited for after the next compute segment
            else:
                handle.wait()
        elif pending is not None:
            pending.wait()
            pending = None


def training_program(config):
    """Build the per-rank program for a config with a ``model`` (called once per shard)."""
    layout = layout_of(config)
    schedule = schedule_for(config)
    p, t, m = config.parallel, config.training, config.model
    micro = t.global_batch_size // (t.micro_batch_size * p.data)
    elem = BYTES_PER_ELEMENT[t.precision]
    shape = layer_shape(config)
    # pipeline messages: b*s*h elements, split over the tensor group (Megatron scatter-gather)
    p2p_bytes = t.micro_batch_size * t.seq_length * m.hidden_size * elem // p.tensor
    layer_grad_bytes = lc.layer_params_per_rank(shape) * (2 if t.precision == "fp16" else 4)
    layer_weight_bytes = lc.layer_params_per_rank(shape) * (4 if t.precision == "fp32" else 2)
    bucket_bytes = int(p.bucket_size_mb * MiB)
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
        n_layers = layers_of_stage(config, stage)
        last_stage = p.pipeline - 1
        optimizer_segments = to_segments(
            lc.optimizer_step_ops(params_on_rank(config, stage) // (p.data if p.zero_stage >= 1 else 1), t.precision),
            gpu.spec,
            t.precision,
        )

        weights, grads, optimizer = static_bytes(config, stage)
        gpu.alloc(weights, f"stage{stage}.weights")
        gpu.alloc(grads, f"stage{stage}.gradients")
        gpu.alloc(optimizer, f"stage{stage}.optimizer_states")

        def run_segments(segments, suffix: str) -> None:
            launch_segments(gpu, segments, tp_group, suffix)

        def zero3_gathers(layers: int):
            """Launch weight all-gathers one layer ahead; yields before each layer's compute."""
            if p.zero_stage < 3 or dp_group is None:
                for _ in range(layers):
                    yield
                return
            ahead = gpu.all_gather(layer_weight_bytes * p.data, dp_group, async_op=True, stream="dp")
            for i in range(layers):
                current = ahead
                if i + 1 < layers:
                    ahead = gpu.all_gather(layer_weight_bytes * p.data, dp_group, async_op=True, stream="dp")
                current.wait()
                yield

        def neighbour(chunk: int, forward: bool) -> tuple[int, int] | None:
            """(rank, chunk) of the virtual stage this one sends to (forward) or receives grads from."""
            if forward:
                if stage < last_stage:
                    return pp_ranks[stage + 1], chunk
                return (pp_ranks[0], chunk + 1) if chunk + 1 < chunks else None
            if stage > 0:
                return pp_ranks[stage - 1], chunk
            return (pp_ranks[last_stage], chunk - 1) if chunk > 0 else None

        activations: dict[tuple[int, int], object] = {}
        buckets: list = []

        def forward(mb: int, chunk: int) -> None:
            first = stage == 0 and chunk == 0
            final = stage == last_stage and chunk == chunks - 1
            if not first:
                src = pp_ranks[stage - 1] if stage > 0 else pp_ranks[last_stage]
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
                src = pp_ranks[stage + 1] if stage < last_stage else pp_ranks[0]
                gpu.recv(src, p2p_bytes, tag=1000 + chunk, async_op=True, stream=f"pp.recv.bwd{chunk}").wait()
            suffix = f" mb{mb}"
            reduce_now = mb == micro - 1 and dp_group is not None
            accumulated = 0
            if final:
                run_segments(segs.logits_backward, suffix)
            for _ in zero3_gathers(n_layers):
                rebuilt = gpu.alloc(full_layer, f"stage{stage}.recomputed_layer") if full_layer else None
                run_segments(segs.layer_backward, suffix)
                if rebuilt is not None:
                    gpu.free(rebuilt)
                accumulated += layer_grad_bytes
                if reduce_now and accumulated >= bucket_bytes:
                    buckets.append(reduce_grads(accumulated))
                    accumulated = 0
            if first:
                run_segments(segs.embedding_backward, suffix)
            if reduce_now and accumulated:
                buckets.append(reduce_grads(accumulated))
            gpu.free(activations.pop((mb, chunk)))
            if not first:
                dst, dst_chunk = neighbour(chunk, False)
                gpu.send(dst, p2p_bytes, tag=1000 + dst_chunk, async_op=True, stream="pp.send.bwd")

        def reduce_grads(size: int):
            if p.zero_stage >= 1:
                return gpu.reduce_scatter(size, dp_group, async_op=True, stream="dp")
            return gpu.all_reduce(size, dp_group, async_op=True, stream="dp")

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
            if p.pipeline > 1 and m.tie_embeddings and stage in (0, last_stage):
                embedding = gpu.new_group(layout.embedding_group(rank))
                vocab_bytes = -(-m.vocab_size // p.tensor) * m.hidden_size * 4
                gpu.all_reduce(vocab_bytes, embedding, stream="dp")
            run_segments(optimizer_segments, "")
            if p.zero_stage in (1, 2) and dp_group is not None:
                gpu.all_gather(params_on_rank(config, stage) * elem, dp_group, stream="dp")
            gpu.mark_iteration()

    return program
