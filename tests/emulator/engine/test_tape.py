"""Tapes (emulator/engine/tape.py): a rank's plain pipeline steps launched by the engine from a list
the built-in program hands over, against the program launching them itself (``EMULATOR_TAPE=0``),
and with their sends in the kernels (``EMULATOR_TAPE=kernel``) against tapes in Python (``python``).

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
from emulator.engine import opcore as engine_opcore
from emulator.engine.opmessages import ST_SENT, ST_STEPPED
from emulator.errors import EmulatorError
from emulator.runner.sequence import execute
from netmodel.errors import ConfigError
from tests.conftest import CONFIGS
from tests.emulator.engine.test_opcore_fuzz import run_dir

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
def kernel_sent(monkeypatch):
    """How many of the tapes' sends and receives the kernels took (OpCore.launch_send,
    launch_recv, and launch_step: ``stepped`` counts its calls that took a message), and how many
    stand-ins Python sealed with messages in flight and the kernels
    handed back (OpCore.drained)."""
    counts = {"sent": 0, "received": 0, "drained": 0, "stepped": 0, "chained": 0}
    launch_send, launch_recv = engine_opcore.OpCore.launch_send, engine_opcore.OpCore.launch_recv
    launch_step = engine_opcore.OpCore.launch_step
    drained = engine_opcore.OpCore.drained
    settle = engine_opcore.OpCore.settle

    def counting_settle(self, gpu):  # (the proxies the kernels completed themselves: EMULATOR_TAPE=blocks)
        counts["chained"] += int(gpu._mv[engine_opcore.k.R_ADONE])
        return settle(self, gpu)

    def counting(self, gpu, message, name):
        took = launch_send(self, gpu, message, name)
        counts["sent"] += took
        return took

    def counting_recv(self, gpu, message, name):
        took = launch_recv(self, gpu, message, name)
        counts["received"] += took
        return took

    def counting_drained(self, *args):
        counts["drained"] += 1
        return drained(self, *args)

    def counting_step(self, gpu, send, recv):
        status = launch_step(self, gpu, send, recv)
        if status in (ST_SENT, ST_STEPPED):
            counts["sent"] += send is not None
            counts["stepped"] += 1
        counts["received"] += status == ST_STEPPED
        return status

    monkeypatch.setattr(engine_opcore.OpCore, "launch_step", counting_step)
    monkeypatch.setattr(engine_opcore.OpCore, "launch_send", counting)
    monkeypatch.setattr(engine_opcore.OpCore, "launch_recv", counting_recv)
    monkeypatch.setattr(engine_opcore.OpCore, "drained", counting_drained)
    monkeypatch.setattr(engine_opcore.OpCore, "settle", counting_settle)
    return counts


def _run(base: str, overrides: list[str], tape: bool | str, monkeypatch, shards: int = 1):
    """``tape``: True (tapes in Python), "sends" (their sends in the kernels: tape.kernel_sends, the
    default), "kernel" (their receives too: tape.kernel_receives) or False."""
    monkeypatch.setenv("EMULATOR_TAPE", tape if isinstance(tape, str) else "python" if tape else "0")
    config = load_run(CONFIGS / "runs" / f"{base}.yaml", overrides)
    try:
        summary, result, _ = execute(config, shards=shards)
    except EmulatorError as exc:  # an error is a result too: both ways must report it alike
        return type(exc).__name__, str(exc), getattr(exc, "event_key", None)
    data = dataclasses.asdict(result)
    data.pop("extra")
    data.pop("rounds")
    return summary["fingerprint"], data


def _kernels(base: str, overrides: list[str], monkeypatch, shards: int = 1):
    """The run with the tapes' messages in the kernels, one kernel call per launch (``kernel``) and a
    step's block, send and next receive in one call (``steps``, OpCore.launch_step), and a block
    queued behind another started and its proxy completed in the kernels (``blocks``,
    opstreams._chain, OpCore.settle), and a run of chained steps launched in one kernel call
    (``arrays``, OpCore.launch_steps): all alike."""
    kernel = _run(base, overrides, "kernel", monkeypatch, shards)
    assert kernel == _run(base, overrides, "steps", monkeypatch, shards), (base, overrides, "steps")
    assert kernel == _run(base, overrides, "blocks", monkeypatch, shards), (base, overrides, "blocks")
    assert kernel == _run(base, overrides, "arrays", monkeypatch, shards), (base, overrides, "arrays")
    return kernel


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


def _check(seed: int, count: int, taped, monkeypatch, kernel_sent=None, chains: bool = False) -> None:
    """Each case with tapes and without; with ``kernel_sent``, with the tapes' sends in the kernels too."""
    took = sent = stepped = chained = 0
    for base, overrides in _cases(seed, count):
        before = taped[0]
        on = _run(base, overrides, True, monkeypatch)
        took += taped[0] > before
        assert on == _run(base, overrides, False, monkeypatch), (base, overrides)
        if kernel_sent is not None:
            before = kernel_sent["sent"], kernel_sent["received"], kernel_sent["stepped"], kernel_sent["chained"]
            assert on == _kernels(base, overrides, monkeypatch), (base, overrides, "kernel")
            sent += kernel_sent["sent"] > before[0] and kernel_sent["received"] > before[1]
            stepped += kernel_sent["stepped"] > before[2]
            chained += kernel_sent["chained"] > before[3]
    assert took, "no case ran a tape"
    assert kernel_sent is None or sent, "no case sent and received in the kernels"
    assert kernel_sent is None or stepped, "no case launched a step's messages with its block (launch_step)"
    # (a seed whose cases all launch few ops ahead queues no block behind another: the default
    # seeds chain, test_tape_blocks.py covers both ends)
    assert not chains or chained, "no case chained a block in the kernels (EMULATOR_TAPE=blocks)"


@pytest.mark.parametrize("seed", range(2))
def test_fuzzed_pipelines_match_the_program(seed, taped, kernel_sent, monkeypatch):
    _check(seed, 3, taped, monkeypatch, kernel_sent, chains=True)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 12))
def test_more_fuzzed_pipelines_match_the_program(seed, taped, kernel_sent, monkeypatch):
    _check(seed, 4, taped, monkeypatch, kernel_sent)


@pytest.mark.parametrize("ahead", [2, 3, 5, 8])
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "interleaved"])
def test_suspensions_and_schedules(ahead, schedule, taped, kernel_sent, monkeypatch):
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
    assert on == _kernels("megatron-175b-64gpu", args, monkeypatch) and kernel_sent["sent"]
    assert on == _run("megatron-175b-64gpu", args, "sends", monkeypatch)


@pytest.mark.parametrize("shards", [2, 3])
def test_several_shards(shards, taped, kernel_sent, monkeypatch):
    """Tapes on several in-process shards (the sends to another shard are queued for the lookahead
    by Shard.launch, as the program's are; the kernels take those to the shard's own ranks): the
    same results, and one shard's fingerprint."""
    args = ["training.global_batch_size=24"]
    on = _run("megatron-1t-3072gpu", args, True, monkeypatch, shards)
    assert taped[0] > 0
    assert on == _run("megatron-1t-3072gpu", args, False, monkeypatch, shards)
    assert on == _kernels("megatron-1t-3072gpu", args, monkeypatch, shards) and kernel_sent["sent"]
    assert on[0] == _run("megatron-1t-3072gpu", args, True, monkeypatch)[0]


@pytest.mark.parametrize("virtual", [1, 2])
def test_a_receive_of_another_size_fails_alike(virtual, taped, kernel_sent, monkeypatch):
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
    # the receive in the kernels: met at its hand-over or in the mailbox when it starts (OpCore._mismatch)
    assert on == _kernels("megatron-175b-64gpu", args, monkeypatch) and kernel_sent["received"]


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


# -- issue 24 review: errors raised inside a tape, and shapes the cases above do not draw ----------------

# stage 1 of 8 holds 20 of the 96 layers: its weights and activations fill its GPU first, so the first
# out-of-memory is a middle stage's - in a block a tape launched (the first and last stages' are the program's)
HEAVY_STAGE1 = ["parallel.virtual_stages=1", "parallel.pipeline_layers=[4,20,12,12,12,12,12,12]",
                "training.global_batch_size=32"]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "allocating"),
    [
        # a forward block's first row, the microbatch's activations (GPipe: they pile up)
        (["parallel.schedule=gpipe", "training.micro_batch_size=2"], "stage1.activations.mb1.chunk0"),
        (
            ["parallel.schedule=1f1b", "training.micro_batch_size=4", "engine.max_ops_ahead=2"],
            "stage1.activations.mb0.chunk0",
        ),
        # a backward block's rebuilt layer (full recomputation) with every microbatch's activations live
        (
            ["parallel.schedule=gpipe", "training.recompute=full", "training.micro_batch_size=2"],
            "stage1.recomputed_layer",
        ),
    ],
)
def test_out_of_memory_inside_a_tape_fails_alike(extra, allocating, taped, monkeypatch):
    """The same OutOfMemoryError line (the allocation, the use, the largest live allocations: the
    rank's live set as _out_of_memory rebuilds it from the block's rows) from a tape's block as from
    the program's launch; the error is raised while the rank's tape runs."""
    inside = []
    out_of_memory = engine_opcore.OpCore._out_of_memory

    def recording(self, gpu, t):
        inside.append(gpu.rank in self.shard.tapes)
        return out_of_memory(self, gpu, t)

    monkeypatch.setattr(engine_opcore.OpCore, "_out_of_memory", recording)
    args = [*HEAVY_STAGE1, *extra]
    on = _run("megatron-175b-64gpu", args, True, monkeypatch)
    assert on[0] == "OutOfMemoryError" and "on rank 8 at" in on[1] and f"allocating {allocating} (" in on[1], on
    assert inside == [True], inside
    assert on == _run("megatron-175b-64gpu", args, False, monkeypatch)
    assert on == _kernels("megatron-175b-64gpu", args, monkeypatch)


@pytest.mark.parametrize(
    "extra", [["parallel.virtual_stages=1"], ["parallel.virtual_stages=2", "engine.max_ops_ahead=2"]]
)
def test_a_receive_with_the_wrong_tag_deadlocks_alike(extra, taped, kernel_sent, monkeypatch):
    """Rank 16's pipeline receives (a middle stage: from its tape) wait for a tag nobody sends: the
    same DeadlockError line (the ranks, their times, their pending operations) both ways."""
    prepare = engine_api.GPU.prepare_p2p

    def wrong_tag(self, kind, peer, size_bytes, tag=0):
        return prepare(self, kind, peer, size_bytes, tag + 7 if kind == "recv" and self.rank == 16 else tag)

    monkeypatch.setattr(engine_api.GPU, "prepare_p2p", wrong_tag)
    args = ["training.global_batch_size=16", *extra]
    on = _run("megatron-175b-64gpu", args, True, monkeypatch)
    assert taped[0] > 0
    assert on[0] == "DeadlockError" and "recv(src=8, tag=7," in on[1], on
    assert on == _run("megatron-175b-64gpu", args, False, monkeypatch)
    # the same report with the tapes' sends in the kernels (their streams handed back first: Shard.blocked)
    assert on == _kernels("megatron-175b-64gpu", args, monkeypatch) and kernel_sent["sent"]


SMALL_PIPELINE = ["training.global_batch_size=32", "training.micro_batch_size=1", "parallel.tensor=4",
                  "parallel.data=null"]  # fmt: skip


@pytest.mark.parametrize(
    "extra",
    [
        # data parallel 4 with its gradient buckets reduced after the backward (late_buckets), 2 iterations
        [
            "parallel.pipeline=4",
            "parallel.virtual_stages=2",
            "training.iterations=2",
            "parallel.overlap_grad_reduce=false",
            "engine.max_ops_ahead=3",
        ],
        # overlapped buckets and ZeRO-1's overlapped weight gathers in the next iteration's forward
        pytest.param(
            [
                "parallel.pipeline=4",
                "training.iterations=2",
                "parallel.overlap_grad_reduce=true",
                "parallel.zero_stage=1",
            ],
            marks=pytest.mark.slow,
        ),
        # the smallest pipeline with virtual stages, the smallest max_ops_ahead, tapes across 3 iterations
        pytest.param(
            ["parallel.pipeline=2", "parallel.virtual_stages=2", "training.iterations=3", "engine.max_ops_ahead=2"],
            marks=pytest.mark.slow,
        ),
    ],
)
def test_data_parallel_pipelines(extra, taped, kernel_sent, monkeypatch):
    on = _run("llama3-8b-64gpu", [*SMALL_PIPELINE, *extra], True, monkeypatch)
    assert taped[0] > 0
    assert on == _run("llama3-8b-64gpu", [*SMALL_PIPELINE, *extra], False, monkeypatch)
    assert on == _kernels("llama3-8b-64gpu", [*SMALL_PIPELINE, *extra], monkeypatch)
    print(kernel_sent)
    assert kernel_sent["sent"]


@pytest.mark.slow
@pytest.mark.parametrize("shards", [1, 2])
def test_a_slow_nic_window(shards, taped, kernel_sent, monkeypatch):
    """A NIC on the pipeline's path slowed for the bytes it carries in [0.05 s, 0.2 s), programs 2 ops ahead."""
    args = ["training.global_batch_size=16", "engine.max_ops_ahead=2",
            "faults.slow_link=[{nic: {node: 2, index: 0}, factor: 0.1, start_s: 0.05, end_s: 0.2}]"]  # fmt: skip
    on = _run("megatron-175b-64gpu", args, True, monkeypatch, shards)
    assert taped[0] > 0
    assert on == _run("megatron-175b-64gpu", args, False, monkeypatch, shards)
    assert on == _kernels("megatron-175b-64gpu", args, monkeypatch, shards) and kernel_sent["sent"]


@pytest.mark.slow
def test_traced_middle_ranks_beside_tapes(tmp_path, taped, monkeypatch):
    """Ranks 16-23 and 40 traced (their programs launch every step: a traced rank takes no tape)
    beside untraced middle stages' tapes, on 3 shards: every file of the run directory (trace.json
    included) equal both ways, wall-clock figures aside."""
    path = CONFIGS / "runs" / "megatron-175b-64gpu.yaml"
    args = ["training.global_batch_size=16", "engine.max_ops_ahead=3"]
    dirs = {}
    for tape in (True, False):
        monkeypatch.setenv("EMULATOR_TAPE", "1" if tape else "0")
        dirs[tape] = run_dir(path, args, "compiled", tmp_path / str(tape), 3, "16-23,40")
        assert tape or taped[0] > 0
    assert dirs[True][0] is None and "trace.json" in dirs[True][1]
    assert dirs[True] == dirs[False]


def test_python_sends_behind_kernel_sends(taped, kernel_sent, monkeypatch):
    """The last microbatch's backward (its gradient buckets: the program's own launches) sends on
    the stream whose earlier sends the kernels still hold: the stream's stand-in is sealed and the
    program's send goes on when the kernels' last one completes (OpCore.send_drained); and a mark
    or synchronize waiting for every stream's last op waits for the kernels' sends alike."""
    args = [*SMALL_PIPELINE, "parallel.pipeline=4", "parallel.overlap_grad_reduce=true", "parallel.zero_stage=1"]
    on = _run("llama3-8b-64gpu", args, True, monkeypatch)
    assert on == _kernels("llama3-8b-64gpu", args, monkeypatch)
    assert kernel_sent["sent"] and kernel_sent["drained"], kernel_sent
    assert on == _run("llama3-8b-64gpu", args, "sends", monkeypatch)


def test_an_unknown_tape_mode_is_a_config_error(monkeypatch):
    """EMULATOR_TAPE picks how a run is executed, not its results: a typo must not silently measure
    another mode."""
    from emulator.engine import tape
    from emulator.errors import ConfigError

    monkeypatch.setenv("EMULATOR_TAPE", "kernels")
    with pytest.raises(ConfigError, match="EMULATOR_TAPE='kernels': expected one of kernel, sends"):
        tape.enabled()
    for mode in tape.MODES:
        monkeypatch.setenv("EMULATOR_TAPE", mode)
        assert tape.enabled() == (mode != "0")
