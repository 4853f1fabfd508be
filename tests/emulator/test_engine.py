"""The engine: streams and overlap, bug reports (deadlock, mismatch, OOM), determinism."""

import pytest

from emulator.config.loader import load_run
from emulator.errors import CollectiveMismatchError, DeadlockError, OutOfMemoryError, ProgramError
from emulator.runner.sequence import execute
from tests.conftest import CONFIGS, cluster_dict


def test_async_collective_overlaps_compute(run):
    """An async all-reduce runs under the next compute op; a blocking one adds its time."""

    def program(gpu):
        gpu.compute("a", duration_ns=1_000_000)
        handle = gpu.all_reduce(64 << 20, async_op=gpu.args["overlap"])
        gpu.compute("b", duration_ns=1_000_000)
        handle.wait()
        gpu.mark_iteration()

    overlapped, _, _ = run(program, cluster_dict(nodes=1), {"overlap": True})
    serial, _, _ = run(program, cluster_dict(nodes=1), {"overlap": False})
    comm_ns = 2 * 7 * (2000 + (64 << 20) / 8 / 300)
    assert serial["sim_time_s"] * 1e9 == pytest.approx(2e6 + comm_ns, rel=0.01)
    assert overlapped["sim_time_s"] * 1e9 == pytest.approx(1e6 + max(1e6, comm_ns), rel=0.01)


def test_synchronize_returns_virtual_time(run):
    seen = {}

    def program(gpu):
        gpu.compute("a", duration_ns=12345)
        seen[gpu.rank] = gpu.synchronize()

    run(program, cluster_dict(nodes=1))
    assert set(seen.values()) == {12345}


def test_deadlock_is_reported_with_ranks_and_ops():
    config = load_run(CONFIGS / "examples" / "deadlock.yaml")
    pattern = r"blocked forever \(wait cycle of 32 ranks: 0 <- 31 <- 30 .*\): rank 0 .*recv\(src=31"
    with pytest.raises(DeadlockError, match=pattern):
        execute(config)


def test_collective_mismatch_is_reported():
    config = load_run(CONFIGS / "examples" / "mismatch.yaml")
    with pytest.raises(CollectiveMismatchError, match=r"rank 1 issued all_gather.*all_reduce|all_reduce.*all_gather"):
        execute(config)


def test_mismatch_across_nodes_message_level(run):
    """Different sizes on a group spanning nodes are caught from the messages' signatures."""

    def program(gpu):
        gpu.all_reduce(1 << 20 if gpu.rank != 9 else 2 << 20)

    with pytest.raises(CollectiveMismatchError, match="collective mismatch"):
        run(program, cluster_dict(nodes=2))


def test_missing_collective_member_is_a_mismatch(run):
    """A member that never issues the call is named in the report."""

    def program(gpu):
        if gpu.rank != 3:
            gpu.all_reduce(1 << 20)

    with pytest.raises(CollectiveMismatchError, match="rank 3 finished its program"):
        run(program, cluster_dict(nodes=1))


def test_out_of_memory_names_rank_time_and_sizes():
    config = load_run(CONFIGS / "examples" / "oom.yaml")
    pattern = r"out of memory on rank 0 at t=.*activations\.5 \(16\.00 GiB\).*80\.00 GiB"
    with pytest.raises(OutOfMemoryError, match=pattern):
        execute(config)


def test_program_exception_names_rank_and_line(run):
    def program(gpu):
        if gpu.rank == 2:
            raise ValueError("boom")

    with pytest.raises(ProgramError, match=r"rank 2: program raised ValueError: boom at .*test_engine\.py:\d+"):
        run(program, cluster_dict(nodes=1))


def test_recv_size_mismatch_is_reported(run):
    def program(gpu):
        if gpu.rank == 0:
            gpu.send(1, 100)
        elif gpu.rank == 1:
            gpu.recv(0, 200)

    with pytest.raises(ProgramError, match="matched a send of 100 B"):
        run(program, cluster_dict(nodes=1))


BAD_CALLS = {
    "negative send": (lambda gpu: gpu.send(1, -100), r"rank 0: send size_bytes must be >= 0, got -100"),
    "fractional recv": (lambda gpu: gpu.recv(1, 2.5), r"rank 0: recv size_bytes must be a whole number of bytes"),
    "bool size": (lambda gpu: gpu.send(1, True), r"send size_bytes must be a whole number of bytes, got True"),
    "string size": (lambda gpu: gpu.all_reduce("1M"), r"all_reduce size_bytes must be a whole number"),
    "nan collective": (lambda gpu: gpu.all_gather(float("nan")), r"all_gather size_bytes must be a whole number"),
    "collective over memory": (
        lambda gpu: gpu.all_reduce(1 << 70),
        r"rank 0: all_reduce of 1,180,591,620,717,411,303,424 bytes is larger than the GPU's memory "
        r"\(85,899,345,920 bytes, a100-sxm-80gb\)",
    ),
    "message over memory": (lambda gpu: gpu.send(1, 100 << 30), r"send of 107,374,182,400 bytes is larger"),
    "negative alloc": (lambda gpu: gpu.alloc(-1, "x"), r"rank 0: alloc\('x'\) size_bytes must be >= 0"),
    "negative flops": (lambda gpu: gpu.compute("k", flops=-1.0), r"compute\('k'\) flops must be a finite number >= 0"),
    "infinite bytes": (lambda gpu: gpu.compute("k", bytes=float("inf")), r"bytes must be a finite number >= 0"),
    "endless kernel": (lambda gpu: gpu.compute("k", duration_ns=10**30), r"duration_ns must be between 0 and"),
    "negative duration": (lambda gpu: gpu.compute("k", duration_ns=-5), r"duration_ns must be between 0 and"),
    "roofline past the bound": (lambda gpu: gpu.compute("k", flops=1e40), r"compute\('k'\) would last .* s, longer"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_bad_sizes_and_times_are_one_line_naming_rank_and_call(run, case):
    """A wrong size or time is the program's error, named where it was passed (before, a negative
    message or allocation ran with negative times or memory, a 2**70-byte all-reduce hung and a
    huge kernel overflowed a compiled kernel's int64)."""
    call, pattern = BAD_CALLS[case]

    def program(gpu):
        if gpu.rank == 0:
            call(gpu)

    with pytest.raises(ProgramError, match=pattern):
        run(program, cluster_dict(nodes=1))


def test_whole_numbers_of_any_kind_are_sizes(run):
    """numpy integers and integral floats (1e6) are sizes; they give the same run as ints."""
    import numpy as np

    def program(gpu, size):
        if gpu.rank == 0:
            gpu.send(1, size)
        elif gpu.rank == 1:
            gpu.recv(0, 1_000_000)
        gpu.all_reduce(size)
        block = gpu.alloc(size)
        gpu.free(block)
        gpu.mark_iteration()

    sizes = (1_000_000, np.int64(10**6), 1e6)
    summaries = [run(lambda gpu, s=size: program(gpu, s), cluster_dict(nodes=1))[0] for size in sizes]
    assert len({summary["fingerprint"] for summary in summaries}) == 1


@pytest.mark.parametrize("example", ["data-parallel", "ping-pong"])
def test_same_config_same_fingerprint_any_shard_count(example):
    """Results are identical, bit for bit, run after run and with 1, 2 or 4 in-process shards."""
    config = load_run(CONFIGS / "examples" / f"{example}.yaml", ["program_args.iterations=2", "cluster.nodes=4"])
    runs = [execute(config, shards=n)[0] for n in (1, 1, 2, 4)]
    keys = ("fingerprint", "sim_time_s", "events", "bytes_by_tier", "message_size_histogram", "iteration_time_s")
    for other in runs[1:]:
        assert {k: other[k] for k in keys} == {k: runs[0][k] for k in keys}
    assert runs[3]["cross_shard_messages"] > 0


def test_workload_identical_across_shards():
    """A pipeline + data parallel workload crossing shard boundaries gives the same results sharded."""
    config = load_run(CONFIGS / "runs" / "megatron-22b-8gpu.yaml",
                      ["cluster.nodes=4", "parallel.pipeline=2", "parallel.data=2", "training.global_batch_size=16",
                       "model.num_layers=4"])  # fmt: skip
    one = execute(config, shards=1)[0]
    four = execute(config, shards=4)[0]
    assert one["fingerprint"] == four["fingerprint"]
    assert one["iteration_time_s"] == four["iteration_time_s"]
