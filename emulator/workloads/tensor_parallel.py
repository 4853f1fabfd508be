"""Tensor and sequence parallelism (Megatron-LM): the collectives of a tensor group, their sizes and
overlap, and how activations and the vocabulary split over the group.

    emulator run configs/runs/megatron-22b-8gpu.yaml     # tensor 8, sequence parallel

The one description of the technique that the emulated program (training.py), the closed-form
estimate (emulator/studies/estimate.py), the memory model (memory.py) and the planner (emulator/studies/plan.py)
share. Narayanan et al. 2021 split attention heads and the MLP's hidden dimension over ``t`` ranks:
each column-/row-parallel pair of GEMMs ends in an all-reduce of the ``b*s*h`` activation (forward)
or of its gradient (backward). Sequence parallelism (Korthikanti et al. 2022) replaces each
all-reduce by a reduce-scatter and an all-gather of the same buffer, so the layernorms and dropouts
between them run on ``s/t`` tokens and their activations are split too. Where the collectives sit
in a layer is layer_costs.py's op lists (:func:`boundary_collective` gives each its kind and size);
segments.py fuses the compute between them; :func:`launch_segments` launches them and
:func:`segments_time_ns` times the same sequence in closed form.
"""

from __future__ import annotations

from emulator.workloads.experts import dense_mlp_activation_terms, moe_activation_delta

# Megatron overlaps the input-gradient reduction with the weight-gradient GEMM, and with sequence
# parallelism the re-gather of a linear's input with its input-gradient GEMM; every other tensor
# collective is waited for at once. The op names of layer_costs.py that end so are overlapped.
OVERLAPPED_SUFFIXES = (".tp_reduce.backward", ".all_gather.recompute")


def sequence_parallel(parallel) -> bool:
    """Whether a run's ``parallel`` section has sequence parallelism in effect (it needs t > 1)."""
    return parallel.sequence_parallel and parallel.tensor > 1


def sequence_parallel_options(tensor: int) -> list[bool]:
    """The sequence-parallel settings worth telling apart for a tensor size (the planner's axis)."""
    return [False, True] if tensor > 1 else [False]


def boundary_collective(shape, sp_collective: str) -> tuple[str, int] | None:
    """(collective, buffer bytes) at a tensor-parallel boundary of a layer of ``shape``
    (layer_costs.LayerShape): an all-reduce of the ``b*(s/c)*h`` activation of the rank's own
    tokens (context parallelism keeps ``s/c`` of them), or ``sp_collective`` (reduce-scatter or
    all-gather of the same buffer) with sequence parallelism; None when t = 1."""
    if shape.tensor_parallel == 1:
        return None
    tokens = shape.micro_batch_size * shape.seq_length // shape.context_parallel
    size = tokens * shape.hidden_size * shape.bytes_per_element
    return (sp_collective if shape.sequence_parallel else "all_reduce", size)


def loss_reduce_bytes(shape) -> int | None:
    """One of the vocabulary-parallel cross-entropy's small all-reduces: an fp32 value per token of
    the rank's ``s/c``; None when t = 1 (the vocabulary is on one rank)."""
    if shape.tensor_parallel == 1:
        return None
    return 4 * shape.micro_batch_size * shape.seq_length // shape.context_parallel


def vocab_rows(vocab_size: int, tensor: int) -> int:
    """Vocabulary rows of the embedding (and output layer) on one tensor rank: padded up to a
    multiple of ``t`` as Megatron does."""
    return -(-vocab_size // tensor)


def is_overlapped(op_name: str) -> bool:
    """Whether the collective of layer_costs.py named ``op_name`` runs beside the next compute."""
    return op_name.endswith(OVERLAPPED_SUFFIXES)


def activation_terms(model) -> tuple[float, float, float]:
    """Korthikanti et al. 2022's Table 2 terms for this layer, in ``s*b*h`` bytes (16-bit), as
    ``(replicated, split, squares)``: what stays whole on every tensor rank without sequence
    parallelism, what the tensor group splits, and the ``a*s/h`` factor of the ``s x s`` tensors.

    Their GPT layer gives ``(10, 24, 5)``: the two layernorms' inputs (4) and the QKV and fc1 inputs
    (4) and two 1-byte dropout masks (2) replicated; Q and K (4), V (2), the output projection's
    input (2) and the 4h GeLU's input and fc2's input (16) split; softmax output, dropout mask and
    output (5) per score. The same accounting for other layers: K and V shrink by the query groups
    (GQA), the MLP's intermediates follow its width and gating (SwiGLU keeps fc1's two halves and
    the gated product), and a model without dropout keeps no masks and only the softmax output.
    """
    dropout = 1.0 if model.dropout else 0.0
    kv = 2 * 2 * model.query_groups / model.num_attention_heads  # K and V
    replicated = 4 + 4 + 2 * dropout
    split = 2 + kv + 2 + dense_mlp_activation_terms(model)
    squares = 5 if model.dropout else 2
    return replicated, split, squares


def activation_bytes_per_layer(config, recompute: str | None = None) -> int:
    """Activations one layer keeps per tensor rank and microbatch: Korthikanti et al. 2022, Table 2
    (``s*b*h*(...)`` bytes for 16-bit activations, terms from :func:`activation_terms`), for the
    config's recomputation or the one given.

    Without sequence parallelism the replicated part (``10*s*b*h`` for GPT: the layernorms,
    dropouts and layer input) stays whole on every rank; with it everything divides by ``t``.
    """
    m, p, t = config.model, config.parallel, config.training
    recompute = recompute or t.recompute
    s, b, h, a, tp = t.seq_length, t.micro_batch_size, m.hidden_size, m.num_attention_heads, p.tensor
    sp = sequence_parallel(p)
    replicated, split, square_terms = activation_terms(m)
    # context parallelism: a rank keeps its s/c tokens; its queries still score the whole sequence,
    # so the attention term keeps the full s in a*s/h
    sbh = s // p.context * b * h
    # a fused attention kernel keeps no s x s tensor (scores, softmax, dropout mask): the a*s/h
    # term goes, as with selective recomputation
    squares = 0 if t.attention == "flash" else square_terms * a * s / h
    assert recompute != "op_selective", "memory.activation_bytes_per_layer counts per-op checkpointing"
    if recompute == "full":
        value = 2 * sbh / (tp if sp else 1)  # only the layer input is kept
    elif recompute == "selective":
        value = sbh * (replicated + split) / tp if sp else sbh * (replicated + split / tp)
    elif tp == 1:
        value = sbh * (replicated + split + squares)
    elif sp:
        value = sbh * (replicated / tp + split / tp + squares / tp)
    else:
        value = sbh * (replicated + split / tp + squares / tp)
    if m.experts and recompute != "full":
        value += moe_activation_delta(config, sbh)  # experts.py: the MoE MLP instead of the dense one
    scale = 2 if t.precision == "fp32" else 1  # the table counts 16-bit activations
    return int(value * scale)


def launch_segments(gpu, segments: list[tuple], tp_group, suffix: str = "", groups: dict | None = None) -> None:
    """Launch fused compute segments (segments.py) and the collectives between them on ``gpu``: of
    the tensor group ``tp_group``, or of the group ``groups`` names for the segment (context
    ``"cp"``, experts ``"ep"`` and ``"etp"``), on a stream of the group's name. A collective is
    waited for at once, unless it is overlapped; then it is waited for at the next ``"w"`` segment,
    after the compute it runs beside (collectives of one group share a stream, so the last one done
    means all are). :func:`prepare_segments` then :func:`launch_prepared`."""
    launch_prepared(gpu, prepare_segments(gpu, segments, tp_group, groups), suffix)


def prepare_segments(gpu, segments: list[tuple], tp_group, groups: dict | None = None) -> list[tuple]:
    """``segments`` checked once for ``gpu`` (durations, collective calls: the GPU API's checks):
    what :func:`launch_prepared` launches, for every microbatch, without checking again."""
    block = []
    for seg in segments:
        kind = seg[0]
        if kind == "c":
            block.append(("c", seg[1], gpu.compute_ns(seg[1], seg[2]), seg[3]))
        elif kind == "m":
            name = seg[5]
            group = tp_group if name == "tp" else (groups or {}).get(name)
            if group is not None:
                block.append(("m", gpu.prepare_collective(seg[2], seg[3], group), name, seg[4]))
        else:
            block.append(("w", None, None, None))
    return block


def launch_prepared(gpu, block: list[tuple], suffix: str = "", memory: list | None = None) -> None:
    """Launch a block of :func:`prepare_segments`; compute ops are named ``<segment><suffix>``. The
    compiled per-op engine takes the whole block where it applies (emulator/engine/opcore.py).

    A block may allocate and free memory between its segments (training.py joins a layer's
    recomputed activations, a microbatch's activations): ``("a", slot, bytes, name)`` is
    ``memory[slot] = gpu.alloc(bytes, name)`` (``name`` None: the slot holds it), and
    ``("f", slot, bytes, None)`` is ``gpu.free(memory[slot])`` (``bytes`` its size)."""
    if gpu.launch_block(block, memory, suffix):
        return
    pending = None
    for kind, a, b, c in block:
        if kind == "c":
            gpu.launch_compute(a + suffix, b, c)
        elif kind == "m":
            handle = gpu.launch_collective(a, b)
            if c:
                pending = handle  # overlapped: waited for after the next compute segment
            else:
                handle.wait()
        elif kind == "w":
            if pending is not None:
                pending.wait()
                pending = None
        elif kind == "a":
            memory[a] = gpu.alloc(b, memory[a] if c is None else c)
        else:
            gpu.free(memory[a])


def repeat_prepared(block: list[tuple], times: int) -> list[tuple] | None:
    """``times`` copies of a block of :func:`prepare_segments` as one block, which
    :func:`launch_prepared` launches as it launches the copies one after another (the same ops in
    the same order, hence the same run), and the compiled per-op engine as one block (one launch
    and one proxy instead of ``times``); None when the copies would differ from it: the block ends
    with an overlapped collective not waited for, which launch_prepared forgets at the block's end
    and the next copy's ``"w"`` would wait for."""
    pending = False
    for kind, _, _, overlapped in block:
        if kind == "m" and overlapped:
            pending = True
        elif kind == "w":
            pending = False
    return None if pending else block * times


def segments_time_ns(segments: list[tuple], collective_ns, group_ns: dict | None = None) -> tuple[int, int]:
    """(elapsed, compute) ns of one pass over fused segments on the compute stream, in closed form.

    What :func:`launch_segments` makes the engine do: a compute segment runs for its duration; a
    collective (``collective_ns(op, size_bytes)`` for the tensor group's, ``group_ns[name]`` for
    another group's; untimed when absent) is waited for at once, unless it is marked overlapped,
    then it runs beside the next compute segment and the ``"w"`` segment waits for it; collectives
    of one group queue on its stream.
    """
    now = compute = 0
    pending_end = None
    for seg in segments:
        kind = seg[0]
        if kind == "c":
            now += seg[2]
            compute += seg[2]
        elif kind == "m":
            timer = collective_ns if seg[5] == "tp" else (group_ns or {}).get(seg[5])
            duration = timer(seg[2], seg[3]) if timer is not None else 0
            if seg[4]:
                start = now if pending_end is None else max(now, pending_end)
                pending_end = start + duration  # launched after the compute before it
            else:
                now += duration
        elif pending_end is not None:
            now = max(now, pending_end)
            pending_end = None
    return now, compute


def collective_lead_ns(segments: list[tuple], collective_ns, group_ns: dict | None = None) -> tuple[int, int]:
    """(compute before the first collective, summed durations of the collectives) of fused
    segments: the tensor group's, timed by ``collective_ns(op, size_bytes)``, and those of the groups
    ``group_ns`` times by name (e.g. context ``"cp"``)."""
    lead, first, total = 0, True, 0
    for seg in segments:
        if seg[0] == "c" and first:
            lead += seg[2]
        elif seg[0] == "m" and (seg[5] == "tp" or seg[5] in (group_ns or {})):
            first = False
            total += (collective_ns if seg[5] == "tp" else group_ns[seg[5]])(seg[2], seg[3])
    return lead, total
