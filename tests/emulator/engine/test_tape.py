"""Tapes (emulator/engine/tape.py): a rank's plain pipeline steps launched by the engine from a list
the built-in program hands over, against the program launching them itself (``EMULATOR_TAPE=0``).

Fuzzed pipeline configs (stages, virtual stages, GPipe / 1F1B / interleaved, how far programs run
ahead - small values suspend a tape in every phase of a step -, recomputation, iterations, folding,
a straggler, a slow link, several in-process shards) run both ways; every result and the
fingerprint must be equal bit for bit, and the tape must have been taken. A receive whose message
has another size raises the same error at the same event both ways.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from emulator.config.loader import load_run
from emulator.engine import api as engine_api
from emulator.engine import shard as engine_shard
from emulator.errors import EmulatorError
from emulator.runner.sequence import execute
from netmodel.errors import ConfigError
from tests.conftest import CONFIGS

BASES = ["megatron-175b-64gpu", "gpt3-175b-1024gpu", "megatron-1t-3072gpu"]
AXES = [
    ("parallel.tensor", [4, 8, 8]),
    ("parallel.pipeline", [8, 16]),
    ("parallel.virtual_stages", [1, 1, 2, 4]),
    ("parallel.schedule", ["1f1b", "1f1b", "gpipe"]),
    ("training.recompute", ["none", "selective", "full"]),
    ("training.iterations", [1, 2]),
    ("engine.max_ops_ahead", [2, 3, 5, 8, 256]),
    ("engine.fold_tensor_groups", ["true", "false"]),
    ("faults.slow_gpu", ["[{ranks: [5], factor: 0.9}]", "[]"]),
    ("faults.slow_link", ["[{nic: {node: 1, index: 0}, factor: 0.25}]", "[]"]),
]


@pytest.fixture
def taped(monkeypatch):
    """How many steps ran from tapes."""
    steps = [0]
    run_tape = engine_shard.Shard.run_tape

    def counting(self, gpu, tape, held):
        steps[0] += len(tape)
        return run_tape(self, gpu, tape, held)

    monkeypatch.setattr(engine_shard.Shard, "run_tape", counting)
    return steps


def _run(base: str, overrides: list[str], tape: bool, monkeypatch, shards: int = 1):
    monkeypatch.setenv("EMULATOR_TAPE", "1" if tape else "0")
    config = load_run(CONFIGS / "runs" / f"{base}.yaml", overrides)
    try:
        summary, result, _ = execute(config, shards=shards)
    except EmulatorError as exc:  # an error is a result too: both ways must report it alike
        return type(exc).__name__, str(exc), getattr(exc, "event_key", None)
    data = dataclasses.asdict(result)
    data.pop("extra")
    data.pop("rounds")
    return summary["fingerprint"], data


def _cases(seed: int, count: int):
    rng = random.Random(seed)
    made = 0
    while made < count:
        base = rng.choice(BASES)
        overrides = [f"{key}={rng.choice(values)}" for key, values in rng.sample(AXES, 6)]
        settings = dict(o.split("=", 1) for o in overrides)
        pipeline = int(settings.get("parallel.pipeline", 8))
        if base == "megatron-1t-3072gpu" and "parallel.pipeline" not in settings:
            pipeline = 64
        overrides.append(f"training.global_batch_size={pipeline * rng.choice([2, 3, 4])}")
        overrides.append("training.micro_batch_size=1")
        try:
            load_run(CONFIGS / "runs" / f"{base}.yaml", overrides)
        except (ConfigError, EmulatorError):
            continue
        made += 1
        yield base, overrides


def _check(seed: int, count: int, taped, monkeypatch) -> None:
    took = 0
    for base, overrides in _cases(seed, count):
        before = taped[0]
        on = _run(base, overrides, True, monkeypatch)
        took += taped[0] > before
        assert on == _run(base, overrides, False, monkeypatch), (base, overrides)
    assert took, "no case ran a tape"


@pytest.mark.parametrize("seed", range(2))
def test_fuzzed_pipelines_match_the_program(seed, taped, monkeypatch):
    _check(seed, 3, taped, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 12))
def test_more_fuzzed_pipelines_match_the_program(seed, taped, monkeypatch):
    _check(seed, 4, taped, monkeypatch)


@pytest.mark.parametrize("ahead", [2, 3, 5, 8])
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "interleaved"])
def test_suspensions_and_schedules(ahead, schedule, taped, monkeypatch):
    """Every way a step can be cut by a suspension (after its receive, its block's proxy, its
    block, its send), under each schedule (virtual stages 2 for interleaved)."""
    args = ["training.global_batch_size=16", "training.micro_batch_size=1", "parallel.pipeline=8",
            f"engine.max_ops_ahead={ahead}"]  # fmt: skip
    if schedule == "interleaved":
        args += ["parallel.virtual_stages=2", "parallel.schedule=1f1b"]
    else:
        args += ["parallel.virtual_stages=1", f"parallel.schedule={schedule}"]
    on = _run("megatron-175b-64gpu", args, True, monkeypatch)
    assert taped[0] > 0
    assert on == _run("megatron-175b-64gpu", args, False, monkeypatch)


@pytest.mark.parametrize("shards", [2, 3])
def test_several_shards(shards, taped, monkeypatch):
    """Tapes on several in-process shards (the sends to another shard are queued for the lookahead
    by Shard.launch, as the program's are): the same results, and one shard's fingerprint."""
    args = ["training.global_batch_size=24"]
    on = _run("megatron-1t-3072gpu", args, True, monkeypatch, shards)
    assert taped[0] > 0
    assert on == _run("megatron-1t-3072gpu", args, False, monkeypatch, shards)
    assert on[0] == _run("megatron-1t-3072gpu", args, True, monkeypatch)[0]


@pytest.mark.parametrize("virtual", [1, 2])
def test_a_receive_of_another_size_fails_alike(virtual, taped, monkeypatch):
    """A pipeline send one byte longer than its receive (rank 16's, patched in): the same
    ProgramError, at the same event, from a tape and from the program."""
    prepare = engine_api.GPU.prepare_p2p

    def longer(self, kind, peer, size_bytes, tag=0):
        if kind == "send" and self.rank == 16:
            size_bytes += 1
        return prepare(self, kind, peer, size_bytes, tag)

    monkeypatch.setattr(engine_api.GPU, "prepare_p2p", longer)
    args = ["training.global_batch_size=16", f"parallel.virtual_stages={virtual}"]
    on = _run("megatron-175b-64gpu", args, True, monkeypatch)
    assert taped[0] > 0
    assert on[0] == "ProgramError" and "sizes must be equal" in on[1], on
    assert on == _run("megatron-175b-64gpu", args, False, monkeypatch)


def test_shortened_reference_run(taped, monkeypatch):
    """The 3072-GPU reference run with 32 microbatches per pipeline: the recorded fingerprint of the
    shortened runs' shape both ways, and the tapes took most steps."""
    args = ["training.global_batch_size=192"]
    on = _run("megatron-1t-3072gpu", args, True, monkeypatch)
    assert on[0] == "1c935da5e355f913835ae2e70dbc2d63"
    # 384 hosted ranks x 32 microbatches x 2 steps; the first and last stages' are the program's
    assert taped[0] > 0.9 * 384 * 32 * 2 * 62 / 64
    assert on == _run("megatron-1t-3072gpu", args, False, monkeypatch)


@pytest.mark.parametrize(
    "extra",
    [
        ["faults.slow_link=[{nic: {node: 1, index: 0}, factor: 0.25}]"],  # a slow link on the pipeline's path
        ["parallel.virtual_stages=4", "engine.max_ops_ahead=5"],  # interleaved, 4 chunks a stage
        ["faults.slow_gpu=[{ranks: [17], factor: 0.5}]", "engine.fold_tensor_groups=false"],  # a straggler
    ],
)
def test_named_cases(extra, taped, monkeypatch):
    args = ["training.global_batch_size=16", *extra]
    on = _run("megatron-175b-64gpu", args, True, monkeypatch)
    assert taped[0] > 0
    assert on[0] != "OutOfMemoryError", on
    assert on == _run("megatron-175b-64gpu", args, False, monkeypatch)
