"""Pipeline parallelism: stages, model chunks, microbatches, the messages between stages, bubble.

    emulator run configs/runs/megatron-175b-64gpu.yaml     # 8 stages, 1F1B

The one description of the technique that the emulated program (training.py), the closed-form
estimate (emulator/studies/estimate.py), the memory model (memory.py) and the planner (emulator/studies/plan.py)
share. Stage ``s`` holds ``layers_of_chunk(s, c)`` layers in each of its ``v`` model chunks (virtual
stages, interleaved 1F1B); a microbatch goes forward through chunk 0 of every stage, then chunk 1,
..., and its gradients come back the reverse way. The order of a stage's forwards and backwards is
its schedule (emulator/workloads/schedules.py, a registry); Narayanan et al. 2021 (section 2.2)
give the closed forms used here: ``m*v + p - 1`` chunk slots per iteration for ``m`` microbatches,
``p`` stages and ``v`` chunks, hence a bubble of ``(p-1)/(m*v + p - 1)`` of the iteration.
"""

from __future__ import annotations

from emulator.workloads.schedules import WARMUPS, schedule_for
from emulator.workloads.segments import BYTES_PER_ELEMENT
from emulator.workloads.tensor_parallel import vocab_rows


def microbatches(config) -> int:
    """Microbatches one pipeline runs per iteration: the global batch over micro-batch x data."""
    t = config.training
    return t.global_batch_size // (t.micro_batch_size * config.parallel.data)


def layers_of_chunk(config, stage: int, chunk: int) -> int:
    """Layers in model chunk ``chunk`` of pipeline stage ``stage``: ``parallel.pipeline_layers[stage]``,
    or an even split of the layers, where ``embedding_in_split`` / ``loss_in_split`` count the
    embedding and the loss as one layer's slot each (Megatron-Core's
    ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``; Llama 3,
    arXiv:2407.21783 section 3.3.2: "the first model chunk on the first stage has only the
    embedding, and the last model chunk on the last stage has only output projection and loss")."""
    p = config.parallel
    if p.pipeline_layers is not None:
        return p.pipeline_layers[stage]
    slots = (config.model.num_layers + p.embedding_in_split + p.loss_in_split) // (p.pipeline * p.virtual_stages)
    first = p.embedding_in_split and stage == 0 and chunk == 0
    last = p.loss_in_split and stage == p.pipeline - 1 and chunk == p.virtual_stages - 1
    return slots - first - last


def layers_of_stage(config, stage: int) -> int:
    """The most layers any model chunk of pipeline stage ``stage`` holds (what sizes its peak)."""
    return max(layers_of_chunk(config, stage, c) for c in range(config.parallel.virtual_stages))


def layers_on_stage(config, stage: int) -> int:
    """All the layers pipeline stage ``stage`` holds, over its model chunks."""
    return sum(layers_of_chunk(config, stage, c) for c in range(config.parallel.virtual_stages))


def message_bytes(config) -> int:
    """One activation (forward) or gradient (backward) message between neighbouring stages:
    ``b*(s/c)*h`` elements (a context rank sends its own tokens to its peer of the next stage),
    split over the tensor group (Megatron's scatter-gather: each tensor rank sends its slice, the
    receivers all-gather it again inside their node)."""
    t, m, p = config.training, config.model, config.parallel
    tokens = t.micro_batch_size * t.seq_length // p.context
    return tokens * m.hidden_size * BYTES_PER_ELEMENT[t.precision] // p.tensor


def send_target(stage: int, chunk: int, forward: bool, stages: int, chunks: int) -> tuple[int, int] | None:
    """(stage, chunk) a virtual stage sends its forward activations (or backward gradients) to;
    None at the model's ends. The last stage's chunk ``c`` feeds stage 0's chunk ``c + 1``."""
    if forward:
        if stage < stages - 1:
            return stage + 1, chunk
        return (0, chunk + 1) if chunk + 1 < chunks else None
    if stage > 0:
        return stage - 1, chunk
    return (stages - 1, chunk - 1) if chunk > 0 else None


def receive_source(stage: int, forward: bool, stages: int) -> int:
    """The stage a forward's activations (or a backward's gradients) come from (wrapping around
    between model chunks)."""
    return (stage - 1) % stages if forward else (stage + 1) % stages


def in_flight(config, stage: int) -> tuple[int, int]:
    """(model chunks, last-chunk microbatches) whose activations stage ``stage`` holds at its peak.

    Closed forms of the schedules (tests/emulator/test_limits.py checks them against walking the
    schedules), so that ``emulator check`` costs the same for 10 microbatches as for 65,536: a
    schedule holds its warm-up forwards plus one (GPipe: every microbatch). The second figure
    counts the chunks that also hold fp32 logits on the last stage: all of them when the warm-up
    covers every microbatch (GPipe), else one.
    """
    p = config.parallel
    micro = microbatches(config)
    total = micro * p.virtual_stages
    warmup = WARMUPS[schedule_for(config)](stage, p.pipeline, micro, p.virtual_stages)
    peak = min(warmup + 1, total)
    return peak, (micro if warmup >= total else min(1, micro))


def bubble_fraction(stages: int, micro: int, chunks: int = 1) -> float:
    """The share of an iteration a stage idles in fill and drain, equal stages and free messages:
    ``(p-1) / (m*v + p - 1)`` (Narayanan et al. 2021; ``(p-1)/(m+p-1)`` for 1F1B and GPipe)."""
    return (stages - 1) / (micro * chunks + stages - 1)


def pipeline_ns(chunk_ns_by_stage: list[int], micro: int, chunks: int) -> int:
    """Fill, steady state and drain of 1F1B / GPipe / interleaved 1F1B, without communication.

    Narayanan et al. 2021 (section 2.2): with ``m`` microbatches of ``p`` equal stages of ``v``
    chunks each taking ``c`` (forward + backward), an iteration lasts ``(m*v + p - 1) * c``, a
    bubble of ``(p-1)/v`` stage times. With unequal stages the first microbatch still crosses every
    stage once and the others follow at the pace of the slowest: ``(m*v - 1) * max(c_s) + sum(c_s)``,
    which is the formula above for equal stages.
    """
    return (micro * chunks - 1) * max(chunk_ns_by_stage) + sum(chunk_ns_by_stage)


def schedule_walk_ns(forward_ns: list[list[int]], backward_ns: list[list[int]], hop_ns: list[int], micro: int,
                     schedule) -> list[int]:  # fmt: skip
    """When each stage ends its last action, walking the schedule's actions in order (no events).

    ``forward_ns[s][c]`` / ``backward_ns[s][c]``: one microbatch through chunk ``c`` of stage ``s``;
    ``hop_ns[s]``: a message from stage ``s`` to ``s + 1`` (the last entry: last stage to stage 0,
    the interleaved wrap-around); ``schedule``: a function of emulator/workloads/schedules.py.

    :func:`pipeline_ns` is exact for equal stages only: with unequal ones (uneven
    ``pipeline_layers``, stages on different GPU types) the fill, the steady state and the drain
    are paced by different stages, and 1F1B's alternation lets a fast stage idle between a slow
    neighbour's forwards and backwards. Here every stage runs its action list as
    emulator/workloads/training.py does: an action starts when the stage is free and its input
    has arrived (the neighbour's action ended, then the send queued behind that stage's earlier
    sends in the same direction and took its hop).
    """
    stages, chunks = len(forward_ns), len(forward_ns[0])
    plans = [schedule(s, stages, micro, chunks) for s in range(stages)]
    arrival = [-1] * (2 * stages * chunks * micro)  # input ready, by (direction, stage, chunk, microbatch)

    def slot(forward: bool, stage: int, chunk: int, mb: int) -> int:
        return ((forward * stages + stage) * chunks + chunk) * micro + mb

    position, now = [0] * stages, [0] * stages
    send_free = [[0, 0] for _ in range(stages)]  # per stage: the backward and the forward send stream
    progress = True
    while progress:
        progress = False
        for s in range(stages):
            actions, i, t = plans[s], position[s], now[s]
            while i < len(actions):
                forward, mb, c = actions[i]
                first, final = s == 0 and c == 0, s == stages - 1 and c == chunks - 1
                # a forward takes its input from the stage before; a backward from the stage after
                receives = not first if forward else not final
                ready = arrival[slot(forward, s, c, mb)] if receives else 0
                if ready < 0:
                    break  # waits for a neighbour not walked this far yet
                t = max(t, ready) + (forward_ns[s][c] if forward else backward_ns[s][c])
                target = send_target(s, c, forward, stages, chunks)
                if target is not None:
                    # the hop to the next stage, or from the previous one back (the last entry: the wrap)
                    if forward:
                        hop = hop_ns[s] if s < stages - 1 else hop_ns[-1]
                    else:
                        hop = hop_ns[s - 1] if s > 0 else hop_ns[-1]
                    send_free[s][forward] = max(send_free[s][forward], t) + hop
                    arrival[slot(forward, *target, mb)] = send_free[s][forward]
                i += 1
                progress = True
            position[s], now[s] = i, t
    assert all(position[s] == len(plans[s]) for s in range(stages)), "the schedule deadlocks"
    return now


def tied_embedding_bytes(config) -> int:
    """The all-reduce that keeps the first stage's input embedding and the last stage's copy of it
    (the output layer) equal, when they are tied and on different stages: the fp32 gradients of
    this tensor rank's vocabulary rows (in ``training.grad_reduce_dtype`` when given); 0 when nothing
    is to sync."""
    p, m = config.parallel, config.model
    if p.pipeline < 2 or not m.tie_embeddings:
        return 0
    grad_bytes = 2 if config.training.grad_reduce_dtype == "bf16" else 4
    return vocab_rows(m.vocab_size, p.tensor) * m.hidden_size * grad_bytes
