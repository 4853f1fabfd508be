"""The built-in training workload: bubble, FLOPs, memory, ZeRO traffic, out-of-memory."""

import os

import pytest

from emulator.config.loader import load_run
from emulator.errors import OutOfMemoryError
from emulator.runner.sequence import execute
from emulator.workloads.memory import activation_bytes_per_layer, stage_memory
from emulator.workloads.metrics import model_flops_per_iteration
from emulator.workloads.pipeline import bubble_fraction
from tests.conftest import CONFIGS

RUN = CONFIGS / "runs" / "megatron-22b-8gpu.yaml"


def _config(*overrides):
    return load_run(RUN, list(overrides))


def test_model_flops_match_korthikanti_formula():
    """Model FLOPs equal 72*B*L*s*h^2*(1 + s/(6h) + V/(12hL)) for the GPT models."""
    config = load_run(CONFIGS / "runs" / "megatron-175b-64gpu.yaml")
    b, layers, s, h, v = 64, 96, 2048, 12288, 51200
    expected = 72 * b * layers * s * h**2 * (1 + s / (6 * h) + v / (12 * h * layers))
    assert model_flops_per_iteration(config) == pytest.approx(expected, rel=0.005)


@pytest.mark.parametrize("recompute,sp,formula", [
    ("none", False, lambda s, b, h, a, t: s * b * h * (10 + 24 / t + 5 * a * s / (h * t))),
    ("none", True, lambda s, b, h, a, t: s * b * h * (34 / t + 5 * a * s / (h * t))),
    ("selective", False, lambda s, b, h, a, t: s * b * h * (10 + 24 / t)),
    ("selective", True, lambda s, b, h, a, t: s * b * h * 34 / t),
    ("full", False, lambda s, b, h, a, t: 2 * s * b * h),
])  # fmt: skip
def test_activation_memory_follows_table2(recompute, sp, formula):
    config = _config(f"training.recompute={recompute}", f"parallel.sequence_parallel={sp}")
    assert activation_bytes_per_layer(config) == int(formula(2048, 4, 6144, 64, 8))


def test_zero_stages_partition_states():
    """ZeRO 1 divides optimizer states by the data-parallel size, 2 the gradients too, 3 the weights."""
    base = load_run(CONFIGS / "runs" / "bloom-560m-zero2.yaml", ["parallel.zero_stage=0"])
    zero = [stage_memory(load_run(CONFIGS / "runs" / "bloom-560m-zero2.yaml", [f"parallel.zero_stage={z}"]), 0)
            for z in (1, 2, 3)]  # fmt: skip
    full = stage_memory(base, 0)
    assert zero[0].optimizer_bytes == pytest.approx(full.optimizer_bytes / 32, rel=1e-3)
    assert zero[1].grads_bytes == pytest.approx(full.grads_bytes / 32, rel=1e-3)
    assert zero[2].params_bytes == pytest.approx(full.params_bytes / 32, rel=1e-3)


def test_pipeline_bubble_closed_form():
    """With cheap communication, 1F1B idles (p-1)/(m+p-1) of the iteration waiting on pipeline neighbours."""
    p, m = 4, 8
    config = _config("cluster.nodes=4", f"parallel.pipeline={p}", "parallel.tensor=8", "parallel.data=1",
                     f"training.global_batch_size={4 * m}", "model.num_layers=8", "model.vocab_size=512")  # fmt: skip
    summary = execute(config)[0]
    assert summary["bubble_fraction"] == pytest.approx(bubble_fraction(p, m), rel=0.15)


def test_zero2_reduce_scatters_and_gathers_over_data_parallel():
    overrides = ["training.iterations=1", "training.global_batch_size=128"]
    summary, result, _ = execute(load_run(CONFIGS / "runs" / "bloom-560m-zero2.yaml", overrides))
    assert set(result.kind_hist) == {"reduce_scatter", "all_gather"}
    assert summary["mfu"] > 0.05
    assert summary["peak_memory_bytes_by_stage"]["0"] == summary["predicted_peak_memory_bytes_by_stage"]["0"]


def test_zero3_gathers_weights_every_layer():
    config = load_run(CONFIGS / "runs" / "bloom-560m-zero2.yaml",
                      ["parallel.zero_stage=3", "training.iterations=1", "training.global_batch_size=128"])  # fmt: skip
    _, result, _ = execute(config)
    gathers = sum(result.kind_hist["all_gather"].values())
    # forward and backward gather each of the 24 layers for every microbatch (1 here), 32 members,
    # message-level ring over 4 nodes: (n-1) messages per member per channel
    assert gathers > 2 * 24 * 32


def test_workload_out_of_memory_names_stage():
    config = _config("training.recompute=none", "training.micro_batch_size=16", "training.global_batch_size=16")
    with pytest.raises(OutOfMemoryError, match=r"rank 0 .*stage0\.activations\.mb0"):
        execute(config)


def test_uneven_pipeline_on_heterogeneous_cluster():
    summary = execute(load_run(CONFIGS / "runs" / "hetero-uneven-pipeline.yaml"))[0]
    assert set(summary["peak_memory_bytes_by_stage"]) == {"0", "1", "2", "3"}
    assert 0 < summary["mfu"] < 1


def test_the_ranks_of_a_stage_share_its_facts(monkeypatch):
    """training_program's stage_facts: a stage's layers, buckets and schedule are built once per
    stage (and GPU type), not once per rank: 64 unfolded rank programs, two stages, two schedules
    (the results are pinned elsewhere: tests/test_shipped_runs.py, the reference runs)."""
    from emulator.workloads import schedules, training

    walked = []
    schedule = schedules.one_f_one_b

    def counting(config):
        def walk(stage, stages, micro, chunks):
            walked.append(stage)
            return schedule(stage, stages, micro, chunks)

        return walk

    monkeypatch.setattr(training, "schedule_for", counting)
    overrides = ["parallel.pipeline=2", "parallel.virtual_stages=1", "parallel.data=4",
                 "training.global_batch_size=16", "model.num_layers=4", "engine.fold_tensor_groups=false"]  # fmt: skip
    config = load_run(CONFIGS / "runs" / "megatron-175b-64gpu.yaml", overrides)
    summary, result, _ = execute(config)
    assert sorted(walked) == [0, 1]
    assert len(result.ranks) == 64 and summary["events"] > 0


FIRST_AND_LAST = [
    # two stages: every step is the first or the last stage's (their embedding and logits join the block)
    ["parallel.pipeline=2", "parallel.virtual_stages=1", "parallel.data=4", "model.num_layers=4"],
    # one stage, first and last at once: embedding, layers and logits in one block
    ["parallel.pipeline=1", "parallel.virtual_stages=1", "parallel.data=8", "model.num_layers=2"],
    # interleaved: stage 0's second chunk and stage 1's first are middle chunks
    ["parallel.pipeline=2", "parallel.virtual_stages=2", "parallel.data=4", "model.num_layers=8"],
    # GPipe: every forward, then every backward
    ["parallel.pipeline=2", "parallel.virtual_stages=1", "parallel.data=4", "model.num_layers=4",
     "parallel.schedule=gpipe", "training.recompute=none"],
    # rebuilt layers' allocs and frees around each layer, a slow rank (its own template), few ops ahead
    ["parallel.pipeline=2", "parallel.virtual_stages=1", "parallel.data=4", "model.num_layers=4",
     "training.recompute=full", "faults.slow_gpu=[{ranks: [5], factor: 0.9}]", "engine.max_ops_ahead=5"],
    # ZeRO 1 with overlapped weight gathers: the first steps of a chunk wait for them (not taped)
    ["parallel.pipeline=2", "parallel.virtual_stages=1", "parallel.data=4", "model.num_layers=4",
     "parallel.zero_stage=1", "parallel.overlap_param_gather=true"],
]  # fmt: skip


@pytest.mark.parametrize("overrides", FIRST_AND_LAST)
def test_first_and_last_stage_steps_run_from_tapes_alike(overrides, monkeypatch):
    """training.step_block: the first and last stage's plain steps join their embedding and logits
    segments to the layers' block and run from a tape (emulator/engine/tape.py); the run is the one
    of the program launching every block itself (EMULATOR_TAPE=0), bit for bit. Two stages or one:
    without step_block no step would be taped."""
    import dataclasses

    from emulator.engine import shard as engine_shard

    taped = [0]
    run_tape = engine_shard.Shard.run_tape

    def counting(self, gpu, steps, held):
        taped[0] += len(steps)
        return run_tape(self, gpu, steps, held)

    monkeypatch.setattr(engine_shard.Shard, "run_tape", counting)
    runs = []
    for tape in ("0", "steps"):
        monkeypatch.setenv("EMULATOR_TAPE", tape)
        config = load_run(CONFIGS / "runs" / "megatron-175b-64gpu.yaml",
                          [*overrides, "training.global_batch_size=32", "engine.fold_tensor_groups=false"])  # fmt: skip
        summary, result, _ = execute(config)
        data = dataclasses.asdict(result)
        data.pop("extra")
        runs.append((summary["fingerprint"], data))
        if tape == "0":
            assert taped[0] == 0
    assert runs[0] == runs[1]
    assert taped[0] > 0


def test_kernel_messages_in_flight_fit_the_op_heap(monkeypatch):
    """The shape of `emulator validate`'s Megatron 70B H100 row, small (768 GPUs, TP 8 x PP 2 with a
    layer a chunk, folded to 96 ranks): half the ranks' tape sends in flight at once in the op
    kernels, each an event of their heap beside every rank's compute and tensor streams' - more
    than the 2 x ranks + 16 rows the heap had, whose next rows were G_HEAPN: the kernels crashed
    (a segfault in OpCore.run) with the sends in the kernels (EMULATOR_TAPE=sends ... blocks). The
    heap holds a row per stream head the kernels start (OpCore.__init__), and each mode's run is
    the Python rules' (python, 0) bit for bit."""
    import dataclasses

    from emulator.engine import opcore
    from emulator.engine import opkernels as k
    from emulator.engine.result import fingerprint
    from emulator.studies.validate import megatron_h100_config, run_case

    peak = {}  # the op heap's events after a kernel call, the most (the rows the old size had)
    after = opcore.OpCore._after

    def counting(self):
        n = int(self.g[k.G_HEAPN]) - (2 * len(self.ranks) + 16)
        peak[os.environ["EMULATOR_TAPE"]] = max(n, peak.get(os.environ["EMULATOR_TAPE"], -1 << 62))
        return after(self)

    monkeypatch.setattr(opcore.OpCore, "_after", counting)
    config = megatron_h100_config(("tiny", 24, 512, 8, 8, 2, 768, 192))
    assert (config.parallel.virtual_stages, config.training.global_batch_size // 48) == (12, 4)
    runs = {}
    for tape in ("0", "python", "sends", "kernel", "blocks", "arrays"):
        monkeypatch.setenv("EMULATOR_TAPE", tape)
        result = run_case(config)
        data = dataclasses.asdict(result)
        data.pop("extra")
        runs[tape] = (fingerprint(result), data)
    assert all(runs[tape] == runs["0"] for tape in runs), [tape for tape in runs if runs[tape] != runs["0"]]
    # (the Python rules' messages are not the kernels' events; the kernels' sends were past the old rows.
    # Counted after each kernel call from Python: in ``blocks`` most receives complete inside the
    # message core's run (oploop._run_net_at), which this count does not see, so ``kernel`` stands in)
    assert peak["python"] <= 0 and peak["sends"] > 0 and peak["kernel"] > 0, peak
