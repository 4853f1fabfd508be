"""Pipeline schedules, found by name: the ordered forward/backward actions of one stage.

An action is ``(is_forward, microbatch, chunk)``; ``chunk`` is the model chunk (virtual stage
index on this rank, 0 unless interleaved). Schedules follow Megatron-LM (Narayanan et al. 2021):
bubble fraction (p-1)/m for GPipe and 1F1B, (1/v)(p-1)/m for interleaved 1F1B with v chunks.
"""

from __future__ import annotations

from collections.abc import Callable

from emulator.errors import ConfigError

Action = tuple[bool, int, int]


def gpipe(stage: int, stages: int, micro: int, chunks: int) -> list[Action]:
    """All forwards, then all backwards in reverse order (activations of m microbatches live)."""
    return [(True, i, 0) for i in range(micro)] + [(False, i, 0) for i in reversed(range(micro))]


def gpipe_warmup(stage: int, stages: int, micro: int, chunks: int) -> int:
    """Forwards before GPipe's first backward: every one."""
    return micro * chunks


def one_f_one_b_warmup(stage: int, stages: int, micro: int, chunks: int) -> int:
    """Forwards before 1F1B's first backward: one per later stage (the first microbatch's way down)."""
    return min(stages - stage - 1, micro)


def interleaved_warmup(stage: int, stages: int, micro: int, chunks: int) -> int:
    """Forwards before interleaved 1F1B's first backward (Megatron's ``num_warmup_microbatches``)."""
    return min((stages - stage - 1) * 2 + (chunks - 1) * stages, micro * chunks)


def one_f_one_b(stage: int, stages: int, micro: int, chunks: int) -> list[Action]:
    """PipeDream-flush: p - stage - 1 warm-up forwards, then alternate, then drain."""
    warmup = one_f_one_b_warmup(stage, stages, micro, chunks)
    actions: list[Action] = [(True, i, 0) for i in range(warmup)]
    for i in range(micro - warmup):
        actions.append((True, warmup + i, 0))
        actions.append((False, i, 0))
    actions.extend((False, i, 0) for i in range(micro - warmup, micro))
    return actions


def interleaved_one_f_one_b(stage: int, stages: int, micro: int, chunks: int) -> list[Action]:
    """Megatron's interleaved schedule over ``micro * chunks`` virtual microbatches."""
    total = micro * chunks
    group = stages * chunks

    def forward(k: int) -> Action:
        return (True, (k // group) * stages + k % stages, (k % group) // stages)

    def backward(k: int) -> Action:
        return (False, (k // group) * stages + k % stages, chunks - 1 - (k % group) // stages)

    warmup = interleaved_warmup(stage, stages, micro, chunks)
    actions = [forward(k) for k in range(warmup)]
    for i in range(total - warmup):
        actions.append(forward(warmup + i))
        actions.append(backward(i))
    actions.extend(backward(k) for k in range(total - warmup, total))
    return actions


SCHEDULES: dict[str, Callable[[int, int, int, int], list[Action]]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved-1f1b": interleaved_one_f_one_b,
}
# each schedule's warm-up forwards, which set the activations it keeps in flight
# (emulator/workloads/pipeline.in_flight) without walking its actions
WARMUPS: dict[Callable, Callable[[int, int, int, int], int]] = {
    gpipe: gpipe_warmup,
    one_f_one_b: one_f_one_b_warmup,
    interleaved_one_f_one_b: interleaved_warmup,
}


def schedule_names(stages: int, chunks: int) -> list[str]:
    """The schedules a layout of ``stages`` stages of ``chunks`` model chunks can run (the rules of
    :func:`schedule_for`): interleaved 1F1B with several chunks; 1F1B, and GPipe when pipelined,
    with one."""
    if chunks > 1:
        return ["interleaved-1f1b"]
    return ["1f1b", "gpipe"] if stages > 1 else ["1f1b"]


def schedule_for(config) -> Callable[[int, int, int, int], list[Action]]:
    """The schedule a config asks for; ``1f1b`` with virtual_stages > 1 is the interleaved one."""
    p = config.parallel
    name = p.schedule
    if name == "1f1b" and p.virtual_stages > 1:
        name = "interleaved-1f1b"
    if name == "gpipe" and p.virtual_stages > 1:
        raise ConfigError("parallel.schedule: gpipe runs one model chunk per stage; set virtual_stages: 1")
    if name not in SCHEDULES:
        raise ConfigError(f"parallel.schedule: unknown {name!r}; known: {', '.join(SCHEDULES)}")
    return SCHEDULES[name]


def peak_in_flight(actions: list[Action]) -> int:
    """The most microbatch-chunks whose activations are held at once (forward done, backward not)."""
    live = peak = 0
    for is_forward, _, _ in actions:
        live += 1 if is_forward else -1
        peak = max(peak, live)
    return peak
