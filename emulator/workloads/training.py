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
    # what every stage's schedule actions (stage_facts) share: the compute ops' name suffixes
    # (launch_prepared's), the activations' keys and their names' tails, the backward actions
    suffixes = [f" mb{mb}" for mb in range(micro)]
    step_keys = [[(mb, c) for c in range(p.virtual_stages)] for mb in range(micro)]
    name_tails = [[f"{mb}.chunk{c}" for c in range(p.virtual_stages)] for mb in range(micro)]
    backward_actions = {plain: [[(False, mb, c, plain, step_keys[mb][c], None, suffixes[mb])
                                 for c in range(p.virtual_stages)] for mb in range(micro)]
                        for plain in (False, True)}  # fmt: skip
    by_stage: dict[tuple[int, str], _Stage] = {}  # (stage, GPU type) -> what its ranks compute alike
    # a plain step's block (program.step_parts) as the first rank of a tensor group joined it, by
    # (forward?, chunk, stage, GPU type, id(segments), the groups' ids): the group's other members
    # hand the engine that block, whose entry (OpCore.known) it has made once
    shared_blocks: dict[tuple, list | None] = {}
    # a prepared block (program.prepared) as the first rank of a tensor group prepared it, by
    # (id(segments), GPU type, the groups' ids): program.run_segments
    shared_prepared: dict[tuple, list] = {}

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
        # static half of the program's run_steps conditions), its activations' key and name and its ops' name suffix
        last_stage = p.pipeline - 1
        actions = []
        buckets = [(replicas > 1 and bool(after or rest)) or expert_buckets for after, rest in facts.grad_buckets]
        # the first and last stage's steps too (their embedding and logits segments join the block),
        # but the last stage's with eager kernels (the loss's own allocation between the blocks)
        eager_final = [t.kernels == "eager" and stage == last_stage and c == chunks - 1 for c in range(chunks)]
        prefix = f"stage{stage}.activations.mb"  # (+ "<mb>.chunk<chunk>": the activations' name)
        append = actions.append
        # (a stage walks micro x chunks x 2 actions: 1,024 for each of the reference's 64 stages;
        # the backward ones are every stage's alike but for ``plain``: shared, as the keys and suffixes)
        for is_forward, mb, chunk in schedule(stage, p.pipeline, micro, chunks):
            if is_forward:
                if eager_final[chunk]:
                    append((True, mb, chunk, False, step_keys[mb][chunk], None, suffixes[mb]))
                else:
                    append((True, mb, chunk, True, step_keys[mb][chunk], prefix + name_tails[mb][chunk], suffixes[mb]))
            else:
                plain = not ((mb == micro - 1 and buckets[chunk]) or eager_final[chunk])
                append(backward_actions[plain][mb][chunk])
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
            # the block as the first rank of this rank's groups prepared it, where the compiled
            # engine takes it (its entry is made once for the group, not once per member: opcore.
            # OpCore.known; the members' calls share their plans, as step_parts' blocks); else,
            # launched op by op, the rank's own calls
            shared = group_prepared(segments) if shares else None
            if shared is None or not gpu.launch_block(shared, None, suffix):
                launch_prepared(gpu, prepared(segments), suffix)

        shares = gpu.takes_tapes()  # (the engine's entries: a compiled per-op engine, an untraced rank)

        def group_prepared(segments) -> list:
            key = (id(segments), gpu.gpu_type, group_ids)
            block = shared_prepared.get(key)
            if block is None:
                block = shared_prepared[key] = prepared(segments)
            return block

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
            backward(mb, chunk) when it is plain, whatever the microbatch; else None. The first
            stage's step has no receive (forward) or send (backward), the last stage's the converse."""
            first = stage == 0 and chunk == 0
            final = stage == last_stage and chunk == chunks - 1
            # the step's block as the first rank of this rank's groups (of its stage, GPU type and
            # segments) joined it: the same rows, hence the compiled engine's template (the members'
            # calls share their plans, opcore.OpCore._plan; a slow rank's entry is its own)
            share = (is_forward, chunk, stage, gpu.gpu_type, id(segs), group_ids)
            block = shared_blocks.get(share, False)
            if block is False:
                block = shared_blocks[share] = step_block(is_forward, chunk, first, final)
            known = None if block is None else gpu.tape_block(block)
            if known is None:
                return None
            recv = send = None
            if is_forward:
                if not first:
                    src = pp_ranks[pipe.receive_source(stage, True, p.pipeline)]
                    recv = prepared_message("recv", src, chunk, f"pp.recv.fwd{chunk}")
                if not final:
                    dst, dst_chunk = neighbour(chunk, True)
                    send = prepared_message("send", dst, dst_chunk, "pp.send.fwd")
            else:
                if not final:
                    src = pp_ranks[pipe.receive_source(stage, False, p.pipeline)]
                    recv = prepared_message("recv", src, 1000 + chunk, f"pp.recv.bwd{chunk}")
                if not first:
                    dst, dst_chunk = neighbour(chunk, False)
                    send = prepared_message("send", dst, 1000 + dst_chunk, "pp.send.bwd")
            return recv, known, send

        def step_block(is_forward: bool, chunk: int, first: bool, final: bool) -> list | None:
            """The one block of a plain step: the ops forward / backward launch between its receive
            and its send, in their order - the activations' alloc, the embedding's segments (first
            stage), the chunk's layers (join_layers), the logits' (last stage), then, backward, the
            activations' free; None when they cannot be one block: a part before another ends with
            an overlapped collective not waited for, which its own launch_prepared would forget
            and the joined block's next "w" would wait for (repeat_prepared)."""
            n = chunk_layers[chunk]
            size = act_layer * n + (logits_bytes(config) if final and not eager else 0)
            if is_forward:
                parts = [[("a", 0, size, None)]]
                if first:
                    parts.append(prepared(segs.embedding_forward))
                parts.append(join_layers(segs.layer_forward, n))
                if final:
                    parts.append(prepared(segs.logits_forward))
            else:
                around = ()
                if full_layer:
                    around = (("a", 0, full_layer, f"stage{stage}.recomputed_layer"), ("f", 0, full_layer, None))
                parts = [prepared(segs.logits_backward)] if final else []
                parts.append(join_layers(segs.layer_backward, n, around))
                if first:
                    parts.append(prepared(segs.embedding_backward))
                parts.append([("f", 1, size, None)])
            if any(part is None for part in parts) or any(repeat_prepared(part, 1) is None for part in parts[:-1]):
                return None
            return [row for part in parts for row in part]

        def run_steps(i: int) -> int:
            """Launch the plain steps among the actions from ``i`` on (stage_facts: its schedule's)
            from tapes, 16 steps at most to a tape (a tape holds its steps until it ends: peak
            memory), up to the first that is not; returns its index. A step forward(mb, chunk) or
            backward(mb, chunk) launches when it is plain (see tape.py; the conditions are theirs:
            the static ones, no gradient buckets, are the action's; here the dynamic ones: no
            overlapped weight gather to wait for, a block the compiled engine takes)."""
            tape: list = []
            n = len(actions)
            while i < n:
                is_forward, mb, chunk, plain, key, name, suffix = actions[i]
                if not plain or (is_forward and gathers and gathers.get(chunk)):
                    break
                parts = (forward_parts if is_forward else backward_parts)[chunk]
                if parts is False:
                    parts = (forward_parts if is_forward else backward_parts)[chunk] = step_parts(is_forward, chunk)
                if parts is None:
                    break
                recv, known, send = parts
                if is_forward:
                    if gathers:
                        gathers.pop(chunk, None)
                    tape.append((recv, known, key, name, None, send, suffix))
                else:
                    tape.append((recv, known, None, None, key, send, suffix))
                i += 1
                if len(tape) == 16:
                    gpu.run_tape(tape, activations)
                    tape = []
            if tape:
                gpu.run_tape(tape, activations)
            return i

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
            i, n = 0, len(actions)
            while i < n:
                if tapes:
                    after = run_steps(i)
                    if after > i:
                        i = after
                        continue
                is_forward, mb, chunk = actions[i][:3]
                if is_forward:
                    forward(mb, chunk)
                else:
                    backward(mb, chunk)
                i += 1
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
