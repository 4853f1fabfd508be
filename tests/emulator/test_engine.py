"""The engine: streams and overlap, bug reports (deadlock, mismatch, OOM), determinism."""

import pytest

from emulator.config.loader import load_run
from emulator.errors import CollectiveMismatchError, DeadlockError, OutOfMemoryError, ProgramError
from emulator.run import execute
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
