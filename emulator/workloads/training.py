"""The built-in training workload: a Megatron-LM style program for every rank.

    emulator run configs/runs/gpt3-175b-1024gpu.yaml

Each rank runs its pipeline stage's schedule (GPipe, 1F1B or interleaved 1F1B). Per microbatch it
receives activations (or gradients) from its pipeline neighbour, runs its layers' fused compute
segments with the tensor-parallel collectives between them, and sends the result on. During the
backward pass of the last microbatch, gradients are reduced over the data-parallel group in
buckets while the rest of the backward still runs (all-reduce, or reduce-scatter with ZeRO >= 1);
then the optimizer steps over the rank's shard and ZeRO 1-2 all-gather the updated weights. ZeRO-3
gathers every layer's weights before its forward and backward (one layer ahead) and reduce-scatters
its gradients after its backward (after FSDP2's copy-in); FSDP2's root unit (embedding, output
layer, final norm) is gathered before a microbatch's first forward and reduce-scattered after its
backward.

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
from emulator.workloads import experts as ex
from emulator.workloads import layer_costs as lc
from emulator.workloads import pipeline as pipe
from emulator.workloads.layout import layout_of
from emulator.workloads.memory import (
    activation_bytes_per_layer,
    expert_params_on_rank,
    logits_bytes,
    params_on_rank,
    rebuilt_layer_bytes,
    static_bytes,
    stepped_params,
    zero3_buffer_bytes,
    zero3_root_params,
)
from emulator.workloads.schedules import schedule_for
from emulator.workloads.segments import layer_shape, model_segments
from emulator.workloads.tensor_parallel import launch_prepared, prepare_segments, repeat_prepared


class _Stage:
    """What every rank of one pipeline stage (on one GPU type) computes alike: training_program's
    ``stage_facts``."""

    __slots__ = ("chunk_layers", "stage_params", "expert_params", "optimizer_segments", "grad_buckets",
                 "gather_buckets", "static", "root_params", "root_weight_bytes", "copy_in", "root_copy_in",
                 "actions")  # fmt: skip


def training_program(config):
    """Build the per-rank program for a config with a ``model`` (called once per shard)."""
    layout = layout_of(config)
    schedule = schedule_for(config)
    p, t = config.parallel, config.training
    micro = pipe.microbatches(config)
    shape = layer_shape(config)
    p2p_bytes = pipe.message_bytes(config)
    layer_params = lc.layer_params_per_rank(shape)
    # the experts' gradients go to their own group; the buckets carry the rest of the layer
    layer_grad_bytes = lc.dense_params_per_rank(shape) * dpar.config_grad_bytes(config)
    expert_grad_bytes = ex.expert_params_per_rank(shape) * dpar.config_grad_bytes(config)
    experts = config.model.experts > 0
    expert_tensor = p.expert_tensor or p.tensor
    loads = ex.config_loads(config)  # each expert-parallel index's share of the routed tokens
    layer_weight_bytes = layer_params * dpar.weight_bytes_per_param(t.precision)
    bucket_bytes = dpar.bucket_bytes(p.bucket_size_mb)
    reduce_op = dpar.gradient_collective(p.zero_stage)
    replicas, shard = dpar.replicas(config), dpar.shard_size(config)
    zero3 = dpar.gathers_every_layer(p.zero_stage) and shard > 1
    tied_bytes = pipe.tied_embedding_bytes(config)
    act_layer = activation_bytes_per_layer(config)
    # with full or per-op recomputation one layer's activations are rebuilt during its backward
    full_layer = rebuilt_layer_bytes(config)
    grad_bytes = dpar.config_grad_bytes(config)
    segments_by_gpu: dict[tuple[str, float], object] = {}
    overlapped_gather = dpar.gathers_after_step(p.zero_stage) and replicas > 1 and p.overlap_param_gather
    # the last microbatch's backward reduces its experts' gradients layer by layer
    expert_buckets = experts and dpar.expert_replicas(config) > 1 and bool(expert_grad_bytes)
    by_stage: dict[tuple[int, str], _Stage] = {}  # (stage, GPU type) -> what its ranks compute alike
    # a plain step's block (program.step_parts) as the first rank of a tensor group joined it, by
    # (forward?, chunk, stage, GPU type, id(segments), the groups' ids): the group's other members
    # hand the engine that block, whose entry (OpCore.known) it has made once
    shared_blocks: dict[tuple, list | None] = {}

    def stage_facts(stage: int, gpu) -> _Stage:
        """What every rank of ``stage`` on a GPU of ``gpu``'s type computes alike (its layers,
        parameters, buckets, allocations, its schedule's actions), computed once per shard: the
        straggler variant runs 3072 rank programs of 64 stages."""
        facts = by_stage.get((stage, gpu.gpu_type))
        if facts is not None:
            return facts
        facts = by_stage[(stage, gpu.gpu_type)] = _Stage()
        chunks = p.virtual_stages
        facts.chunk_layers = chunk_layers = [pipe.layers_of_chunk(config, stage, c) for c in range(chunks)]
        facts.stage_params = stage_params = params_on_rank(config, stage)
        facts.expert_params = expert_params_on_rank(config, stage)
        facts.optimizer_segments = dpar.optimizer_step_segments(stepped_params(config, stage), gpu.spec,
                                                                 t.precision)  # fmt: skip
        # the gradient buckets of one chunk's backward: after which layers, and the rest at its end
        facts.grad_buckets = [dpar.gradient_buckets(n, layer_grad_bytes, bucket_bytes) for n in chunk_layers]
        # ZeRO 1-2 with overlap_param_gather: each chunk's weight gathers, in forward order
        extra_params = stage_params - sum(chunk_layers) * layer_params  # the embedding / output layer
        layer_weight_bytes_dense = lc.dense_params_per_rank(shape) * dpar.weight_bytes_per_param(t.precision)
        facts.gather_buckets = [
            dpar.param_gather_buckets(chunk_layers[c], layer_weight_bytes_dense, bucket_bytes,
                                      extra_params * dpar.weight_bytes_per_param(t.precision) if c == 0 else 0)
            for c in range(chunks)
        ] if overlapped_gather else []  # fmt: skip
        facts.static = static_bytes(config, stage)
        # FSDP2's root unit (the embedding, output layer, final norm of this stage) and its copy-ins
        facts.root_params = root_params = zero3_root_params(config, stage)
        facts.root_weight_bytes = root_params * dpar.weight_bytes_per_param(t.precision)
        facts.copy_in = dpar.zero3_copy_in_segments(lc.dense_params_per_rank(shape), gpu.spec, t.precision,
                                                    grad_bytes) if zero3 else []  # fmt: skip
        facts.root_copy_in = (dpar.zero3_copy_in_segments(root_params, gpu.spec, t.precision, grad_bytes)
                              if root_params else [])
        # the schedule's actions, each with whether it can be a tape's step whatever the rank (the
        # static half of the program's tape_step conditions), its activations' key and name and its ops' name suffix
        last_stage = p.pipeline - 1
        actions = []
        buckets = [(replicas > 1 and bool(after or rest)) or expert_buckets for after, rest in facts.grad_buckets]
        for is_forward, mb, chunk in schedule(stage, p.pipeline, micro, chunks):
            plain = not ((stage == 0 and chunk == 0) or (stage == last_stage and chunk == chunks - 1)
                         or (not is_forward and mb == micro - 1 and buckets[chunk]))  # fmt: skip
            name = f"stage{stage}.activations.mb{mb}.chunk{chunk}" if is_forward and plain else None
            actions.append((is_forward, mb, chunk, plain, (mb, chunk), name, f" mb{mb}"))
        facts.actions = actions
        return facts

    def program(gpu) -> None:
        rank = gpu.rank
        stage = layout.stage_of(rank)
        facts = stage_facts(stage, gpu)
        chunks = p.virtual_stages
        load = loads[layout.expert_coords(rank, p.expert, expert_tensor)[1]] if experts else 1.0
        segs = segments_by_gpu.get((gpu.gpu_type, load))
        if segs is None:
            segs = segments_by_gpu[(gpu.gpu_type, load)] = model_segments(config, gpu.spec, load)
        tp_group = gpu.new_group(layout.tensor_group(rank)) if p.tensor > 1 else None
        groups = {}  # the other groups the layer's collectives run in (tensor_parallel.launch_segments)
        if p.context > 1:
            groups["cp"] = gpu.new_group(layout.context_group(rank))
        if experts and p.expert > 1:
            groups["ep"] = gpu.new_group(layout.expert_group(rank, p.expert, expert_tensor))
        if experts and expert_tensor > 1:
            groups["etp"] = gpu.new_group(layout.expert_tensor_group(rank, p.expert, expert_tensor))
        edp_group = None
        if experts and dpar.expert_replicas(config) > 1:
            edp_group = gpu.new_group(layout.expert_data_group(rank, p.expert, expert_tensor))
        grad_group = gpu.new_group(layout.gradient_group(rank)) if replicas > 1 else None
        shard_group = replica_group = None
        if zero3:
            shard_group = gpu.new_group(layout.shard_group(rank, shard))
            replica_group = gpu.new_group(layout.replica_group(rank, shard)) if shard < replicas else None
        pp_ranks = layout.pipeline_group(rank)
        # what this rank's blocks launch collectives in (shared_blocks)
        group_ids = (tp_group.gid if tp_group is not None else 0, tuple((name, g.gid) for name, g in groups.items()))
        chunk_layers = facts.chunk_layers
        last_stage = p.pipeline - 1
        stage_params = facts.stage_params
        expert_params = facts.expert_params
        optimizer_segments = facts.optimizer_segments
        grad_buckets = facts.grad_buckets
        gather_buckets = facts.gather_buckets

        weights, grads, optimizer = facts.static
        gpu.alloc(weights, f"stage{stage}.weights")
        gpu.alloc(grads, f"stage{stage}.gradients")
        gpu.alloc(optimizer, f"stage{stage}.optimizer_states")
        if zero3:
            gpu.alloc(zero3_buffer_bytes(config), f"stage{stage}.zero3_unit_buffers")
        root_params, root_weight_bytes = facts.root_params, facts.root_weight_bytes
        copy_in, root_copy_in = facts.copy_in, facts.root_copy_in
        root: dict[str, object] = {}  # the root unit's gathered weights, then its gradients, while needed
        # eager: the loss's tensors are freed by torch once its backward has run; the fused path keeps
        # Megatron's fp32 logits to the end of the microbatch (the accounting Korthikanti's rows check)
        eager = t.kernels == "eager"
        loss_buffers: dict[int, object] = {}

        blocks: dict[int, list] = {}  # id(segments) -> its block, checked once (segments outlive the program)

        def prepared(segments) -> list:
            block = blocks.get(id(segments))
            if block is None:
                block = blocks[id(segments)] = prepare_segments(gpu, segments, tp_group, groups)
            return block

        def run_segments(segments, suffix: str) -> None:
            launch_prepared(gpu, prepared(segments), suffix)

        def run_layers(segments, layers: int, suffix: str) -> bool:
            """``layers`` layers of ``segments`` back to back, launched as one block (the same ops as
            ``layers`` run_segments calls; tensor_parallel.repeat_prepared); False when they cannot be."""
            block = join_layers(segments, layers) if layers >= 2 else None
            if block is None:
                return False
            launch_prepared(gpu, block, suffix)
            return True

        joined: dict[tuple, list | None] = {}  # (id(segments), layers, memory rows) -> the block, or None

        def join_layers(segments, layers: int, around: tuple = (), before: tuple = (), after: tuple = ()):
            """``layers`` layers of ``segments`` as one block with the allocs and frees the program
            launches between them (tensor_parallel.launch_prepared's ``"a"`` / ``"f"`` rows):
            ``before`` the first layer, ``around`` each (an alloc and a free), ``after`` the last:
            the same ops in the same order as launched one by one, so that the compiled per-op
            engine takes them as one block; None when they cannot be (repeat_prepared)."""
            key = (id(segments), layers, around, before, after)
            block = joined.get(key, False)
            if block is False:
                one = prepared(segments)
                body = repeat_prepared([around[0], *one, around[1]] if around else one, layers)
                block = joined[key] = None if body is None else [*before, *body, *after]
            return block

        def zero3_gathers(layers: int):
            """Launch weight all-gathers one layer ahead; yields before each layer's compute."""
            if not zero3:
                for _ in range(layers):
                    yield
                return
            ahead = gpu.all_gather(layer_weight_bytes, shard_group, async_op=True, stream="dp")
            for i in range(layers):
                current = ahead
                if i + 1 < layers:
                    ahead = gpu.all_gather(layer_weight_bytes, shard_group, async_op=True, stream="dp")
                current.wait()
                yield

        messages: dict[tuple, tuple] = {}  # (kind, peer, tag) -> (api.prepare_p2p's message, its stream)

        def prepared_message(kind: str, peer: int, tag: int, stream: str) -> tuple:
            """A pipeline send or receive of ``p2p_bytes``, checked once (api.prepare_p2p), and its
            stream (the same for a (kind, peer, tag) every microbatch)."""
            known = messages.get((kind, peer, tag))
            if known is None:
                known = messages[(kind, peer, tag)] = (gpu.prepare_p2p(kind, peer, p2p_bytes, tag), stream)
            return known

        def message(kind: str, peer: int, tag: int, stream: str):
            """Launch a pipeline send or receive (:func:`prepared_message`)."""
            return gpu.launch_p2p(*prepared_message(kind, peer, tag, stream))

        def neighbour(chunk: int, forward: bool) -> tuple[int, int]:
            """(rank, chunk) of the virtual stage this one sends to (forward) or sends gradients to."""
            dst_stage, dst_chunk = pipe.send_target(stage, chunk, forward, p.pipeline, chunks)
            return pp_ranks[dst_stage], dst_chunk

        activations: dict[tuple[int, int], object] = {}
        pending: list = []  # gradient reductions in flight, waited for before the optimizer step
        late_buckets: list[tuple] = []  # without overlap_grad_reduce: (bytes, group) reduced after the backward
        gathers: dict[int, list] = {}  # per chunk: the overlapped weight gathers not yet waited for

        def forward(mb: int, chunk: int) -> None:
            first = stage == 0 and chunk == 0
            final = stage == last_stage and chunk == chunks - 1
            if not first:
                src = pp_ranks[pipe.receive_source(stage, True, p.pipeline)]
                message("recv", src, chunk, f"pp.recv.fwd{chunk}").wait()
            size = act_layer * chunk_layers[chunk] + (logits_bytes(config) if final and not eager else 0)
            name = f"stage{stage}.activations.mb{mb}.chunk{chunk}"
            suffix = f" mb{mb}"
            # the activations' alloc and the chunk's layers as one block where nothing runs between
            # them (no embedding, no weight gathers)
            block = None
            if not (first or zero3 or gathers.get(chunk) or (root_params and "weights" not in root)):
                block = join_layers(segs.layer_forward, chunk_layers[chunk], before=(("a", 0, size, None),))
            if block is not None:
                gathers.pop(chunk, None)
                memory = [name]
                launch_prepared(gpu, block, suffix, memory)
                activations[(mb, chunk)] = memory[0]
            else:
                activations[(mb, chunk)] = gpu.alloc(size, name)
                if root_params and "weights" not in root:
                    # root pre-forward: its all-gather, waited for before any of the stage's compute
                    root["weights"] = gpu.alloc(root_weight_bytes, f"stage{stage}.zero3_root_unit.weights")
                    gpu.all_gather(root_weight_bytes, shard_group, async_op=True, stream="dp").wait()
                waiting = gathers.pop(chunk, None)
                if first:
                    if waiting:
                        waiting.pop(0)[1].wait()
                    run_segments(segs.embedding_forward, suffix)
                # the chunk's layers as one block where nothing runs between them (no weight gathers)
                if zero3 or waiting or not run_layers(segs.layer_forward, chunk_layers[chunk], suffix):
                    for layer, _ in enumerate(zero3_gathers(chunk_layers[chunk])):
                        while waiting and waiting[0][0] <= layer:
                            waiting.pop(0)[1].wait()
                        run_segments(segs.layer_forward, suffix)
            if final:
                if eager:
                    loss_buffers[mb] = gpu.alloc(logits_bytes(config), f"stage{stage}.loss.mb{mb}")
                run_segments(segs.logits_forward, suffix)
            else:
                dst, dst_chunk = neighbour(chunk, True)
                message("send", dst, dst_chunk, "pp.send.fwd")

        def backward(mb: int, chunk: int) -> None:
            first = stage == 0 and chunk == 0
            final = stage == last_stage and chunk == chunks - 1
            if not final:
                src = pp_ranks[pipe.receive_source(stage, False, p.pipeline)]
                message("recv", src, 1000 + chunk, f"pp.recv.bwd{chunk}").wait()
            suffix = f" mb{mb}"
            reduce_now = mb == micro - 1 and grad_group is not None and not zero3
            buckets_after, buckets_rest = grad_buckets[chunk]
            if final:
                run_segments(segs.logits_backward, suffix)
                if mb in loss_buffers:
                    gpu.free(loss_buffers.pop(mb))
            if root_params and "grads" not in root and (final or first):
                # the output layer's (or the embedding's) 16-bit gradients, unsharded until the copy-in
                root["grads"] = gpu.alloc(root_weight_bytes, f"stage{stage}.zero3_root_unit.gradients")
            # the chunk's layers as one block where nothing runs between them but the rebuilt layers'
            # allocs and frees (no weight gathers or unit reductions (ZeRO-3), no gradient bucket
            # after a layer), with the activations' free after them where nothing runs in between
            # (no embedding backward, no gradient bucket)
            between = zero3 or (reduce_now and buckets_after) or (
                mb == micro - 1 and edp_group is not None and expert_grad_bytes)  # fmt: skip
            block, freed = None, False
            if not between:
                freed = not (first or (reduce_now and buckets_rest))
                after = (("f", 1, activations[(mb, chunk)].size_bytes, None),) if freed else ()
                around = ()
                if full_layer:
                    around = (("a", 0, full_layer, f"stage{stage}.recomputed_layer"), ("f", 0, full_layer, None))
                block = join_layers(segs.layer_backward, chunk_layers[chunk], around, after=after)
            if block is not None:
                launch_prepared(gpu, block, suffix, [None, activations.pop((mb, chunk))] if freed else [None])
            else:
                freed = False
                for layer, _ in enumerate(zero3_gathers(chunk_layers[chunk])):
                    rebuilt = gpu.alloc(full_layer, f"stage{stage}.recomputed_layer") if full_layer else None
                    run_segments(segs.layer_backward, suffix)
                    if rebuilt is not None:
                        gpu.free(rebuilt)
                    if zero3:
                        run_segments(copy_in, suffix)
                        reduce_unit(layer_grad_bytes)
                    elif reduce_now and layer in buckets_after:
                        reduce_bucket(buckets_after[layer])
                    if mb == micro - 1 and edp_group is not None and expert_grad_bytes:
                        reduce_bucket(expert_grad_bytes, edp_group)  # the layer's experts, over their replicas
            if first:
                run_segments(segs.embedding_backward, suffix)
            if reduce_now and buckets_rest:
                reduce_bucket(buckets_rest)
            if not freed:
                gpu.free(activations.pop((mb, chunk)))
            if root_params and chunk == 0:
                # the root unit's post-backward: copy-in and reduce-scatter of its gradients; it
                # reshards once no other microbatch of this stage is in flight
                run_segments(root_copy_in, suffix)
                reduce_unit(root_params * grad_bytes)
                if not activations:
                    for held in root.values():
                        gpu.free(held)
                    root.clear()
            if not first:
                dst, dst_chunk = neighbour(chunk, False)
                message("send", dst, 1000 + dst_chunk, "pp.send.bwd")

        # plain steps (a receive, one block the compiled engine takes, a send) run from a tape
        # (emulator/engine/tape.py): the same launches as forward / backward make for them
        tapes = gpu.takes_tapes() and not (zero3 or root_params)
        # per chunk: (receive, block, send) of its plain forward / backward steps, None, or False: not built yet
        forward_parts: list = [False] * chunks
        backward_parts: list = [False] * chunks

        def step_parts(is_forward: bool, chunk: int) -> tuple | None:
            """The receive, block entry (api.GPU.tape_block) and send of forward(mb, chunk) or
            backward(mb, chunk) when it is plain, whatever the microbatch; else None."""
            # the step's block as the first rank of this rank's groups (of its stage, GPU type and
            # segments) joined it: the same rows, hence the compiled engine's template (the members'
            # calls share their plans, opcore.OpCore._plan; a slow rank's entry is its own)
            share = (is_forward, chunk, stage, gpu.gpu_type, id(segs), group_ids)
            block = shared_blocks.get(share, False)
            if block is False:
                if is_forward:
                    size = act_layer * chunk_layers[chunk]
                    block = join_layers(segs.layer_forward, chunk_layers[chunk], before=(("a", 0, size, None),))
                else:
                    around = ()
                    if full_layer:
                        around = (("a", 0, full_layer, f"stage{stage}.recomputed_layer"),
                                  ("f", 0, full_layer, None))  # fmt: skip
                    after = (("f", 1, act_layer * chunk_layers[chunk], None),)
                    block = join_layers(segs.layer_backward, chunk_layers[chunk], around, after=after)
                shared_blocks[share] = block
            if is_forward:
                src, tag, recv_stream = pipe.receive_source(stage, True, p.pipeline), chunk, f"pp.recv.fwd{chunk}"
            else:
                src = pipe.receive_source(stage, False, p.pipeline)
                tag, recv_stream = 1000 + chunk, f"pp.recv.bwd{chunk}"
            known = None if block is None else gpu.tape_block(block)
            if known is None:
                return None
            dst, dst_chunk = neighbour(chunk, is_forward)
            send = (prepared_message("send", dst, dst_chunk, "pp.send.fwd") if is_forward
                    else prepared_message("send", dst, 1000 + dst_chunk, "pp.send.bwd"))  # fmt: skip
            return prepared_message("recv", pp_ranks[src], tag, recv_stream), known, send

        def tape_step(action: tuple):
            """The step forward(mb, chunk) or backward(mb, chunk) of ``action`` (stage_facts: its
            schedule's) launches when it is plain (see tape.py; the conditions are theirs: the
            static ones, no embedding or logits and no gradient buckets, are the action's), else
            None."""
            is_forward, mb, chunk, plain, key, name, suffix = action
            if not plain or (is_forward and gathers and gathers.get(chunk)):
                return None
            parts = (forward_parts if is_forward else backward_parts)[chunk]
            if parts is False:
                parts = (forward_parts if is_forward else backward_parts)[chunk] = step_parts(is_forward, chunk)
            if parts is None:
                return None
            recv, known, send = parts
            if is_forward:
                if gathers:
                    gathers.pop(chunk, None)
                return recv, known, key, name, None, send, suffix
            return recv, known, None, None, key, send, suffix

        def reduce_bucket(size: int, group=None) -> None:
            group = group or grad_group
            if p.overlap_grad_reduce:
                pending.append(getattr(gpu, reduce_op)(size, group, async_op=True, stream="dp"))
            else:
                late_buckets.append((size, group))

        def reduce_unit(size: int) -> None:
            """ZeRO-3: a unit's gradients (a layer's, or the root unit's) reduce-scattered in its
            shard group, the shard then all-reduced across the replicas (hybrid sharding)."""
            pending.append(gpu.reduce_scatter(size, shard_group, async_op=True, stream="dp"))
            if replica_group is not None:
                pending.append(gpu.all_reduce(size // shard, replica_group, async_op=True, stream="dp"))

        actions = facts.actions
        for _ in range(t.iterations):
            for c, buckets in enumerate(gather_buckets):
                gathers[c] = [(layer, gpu.all_gather(size, grad_group, async_op=True, stream="dp"))
                              for layer, size in buckets]  # fmt: skip
            tape: list = []  # plain steps not launched yet (tape_step)
            for action in actions:
                step = tape_step(action) if tapes else None
                if step is not None:
                    tape.append(step)
                    if len(tape) == 16:  # (a tape holds its steps until it ends: a few at a time)
                        gpu.run_tape(tape, activations)
                        tape = []
                    continue
                if tape:
                    gpu.run_tape(tape, activations)
                    tape = []
                if action[0]:
                    forward(action[1], action[2])
                else:
                    backward(action[1], action[2])
            if tape:
                gpu.run_tape(tape, activations)
            for size, group in late_buckets:
                pending.append(getattr(gpu, reduce_op)(size, group, async_op=True, stream="dp"))
            late_buckets.clear()
            for handle in pending:
                handle.wait()
            pending.clear()
            if tied_bytes and stage in (0, last_stage):
                embedding = gpu.new_group(layout.embedding_group(rank))
                gpu.all_reduce(tied_bytes, embedding, stream="dp")
            run_segments(optimizer_segments, "")
            if dpar.gathers_after_step(p.zero_stage) and grad_group is not None and not overlapped_gather:
                gpu.all_gather(dpar.weight_gather_bytes(stage_params - expert_params, t.precision), grad_group,
                               stream="dp")  # fmt: skip
            if dpar.gathers_after_step(p.zero_stage) and edp_group is not None:
                # the experts' updated weights, over their replicas, after the step
                gpu.all_gather(dpar.weight_gather_bytes(expert_params, t.precision), edp_group, stream="dp")
            gpu.mark_iteration()

    return program
