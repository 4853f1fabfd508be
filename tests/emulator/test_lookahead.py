"""The lookahead and the round protocol: safe (same results on any number of shards, fuzzed) and
worth it (rounds grow with cross-shard messages, not with virtual time over the latency)."""

from __future__ import annotations

import random

import pytest

from emulator.config.loader import load_run
from emulator.engine.coordinator import next_horizons
from emulator.errors import EmulatorError
from emulator.runner.sequence import execute
from tests.conftest import CONFIGS, cluster_dict, run_program

INF = float("inf")
WALL = {"wall_time_s", "speed_ratio", "events_per_s", "shard_busy_s", "round_overhead_s", "shard_nodes",
        "rounds", "cross_shard_messages", "shards"}  # fmt: skip


def test_horizons_closed_form():
    """H_j = min over i != j of (min(s_ij, H_i + d_i) + L), never below what was reached."""
    L = 10
    # shard 0 sends at 100 at the earliest, shard 1 at 500, and an arrival makes either send at once
    assert next_horizons([0, 0], [50, 60], [([INF, 100], 0), ([500, INF], 0)], [INF, INF], L) == [120, 110]
    # an arrival makes shard 1 send only 1000 ns later: shard 0 may run to 500 + L
    assert next_horizons([0, 0], [50, 60], [([INF, 100], 0), ([500, INF], 1000)], [INF, INF], L) == [510, 110]
    # three shards in a chain 0 - 1 - 2: shard 2 hears of shard 0's send only through shard 1, which
    # may receive at 110 and send to either side 50 later
    bounds = [([INF, 100, INF], 0), ([500, INF, 700], 50), ([INF, 900, INF], 0)]
    assert next_horizons([0, 0, 0], [50, 60, 70], bounds, [INF, INF, INF], L) == [170, 110, 170]
    # a record on its way to shard 1 at 70 can make it send 50 later
    assert next_horizons([0, 0, 0], [50, 60, 70], bounds, [INF, 70, INF], L) == [130, 110, 130]
    # a bound below the next event counts from the next event; nothing goes below what was done
    assert next_horizons([0, 300], [200, 400], [([INF, 0], 0), ([1000, INF], 0)], [INF, INF], L) == [220, 300]


def pipeline_program(gpu):
    """Rank 0 -> 1 -> ... -> n-1 and back, 40 microbatches of 1 ms compute per stage and direction."""
    n, r = gpu.world_size, gpu.rank
    for mb in range(40):
        if r > 0:
            gpu.recv(r - 1, 1 << 20, tag=mb, async_op=True, stream="pp.fwd").wait()
        gpu.compute("fwd", duration_ns=1_000_000)
        if r < n - 1:
            gpu.send(r + 1, 1 << 20, tag=mb, async_op=True, stream="pp.send")
            gpu.recv(r + 1, 1 << 20, tag=1000 + mb, async_op=True, stream="pp.bwd").wait()
        gpu.compute("bwd", duration_ns=2_000_000)
        if r > 0:
            gpu.send(r - 1, 1 << 20, tag=1000 + mb, async_op=True, stream="pp.send")
    gpu.synchronize()


def test_rounds_follow_messages_not_latency():
    """A pipeline over 4 nodes on 4 shards: ~100 ms of virtual time at 5 us latency would take
    ~20,000 rounds under the plain rule (next event + latency); the lookahead needs a few per
    cross-shard message, with the one-shard results."""
    cluster = cluster_dict(nodes=4, gpus=1, nic_count=1)
    one, _, _ = run_program(pipeline_program, cluster, shards=1)
    four, _, _ = run_program(pipeline_program, cluster, shards=4)
    assert {k: v for k, v in four.items() if k not in WALL} == {k: v for k, v in one.items() if k not in WALL}
    assert one["sim_time_s"] > 0.1
    assert four["cross_shard_messages"] == 2 * 3 * 40
    assert four["rounds"] <= 4 * four["cross_shard_messages"]  # measured: 724


def random_program(seed: int, world: int):
    """A deadlock-free random program: one global list of operations (computes, point-to-point
    transfers, collectives on random groups, waits, synchronisations), each rank launching its part
    in the list's order on random streams, so every dependency points to an earlier operation."""
    rng = random.Random(seed)
    ops = []
    groups = [tuple(range(world))]
    for _ in range(3):
        members = sorted(rng.sample(range(world), rng.randint(2, world)))
        groups.append(tuple(members))
    for _ in range(rng.randint(10, 40)):
        kind = rng.choice(["compute", "compute", "p2p", "p2p", "coll", "sync", "mark"])
        if kind == "compute":
            ops.append(("compute", rng.randrange(world), rng.choice([0, 1_000, 50_000, 2_000_000]),
                        rng.choice(["compute", "side"])))  # fmt: skip
        elif kind == "p2p":
            src, dst = rng.sample(range(world), 2)
            size = rng.choice([0, 4096, 1 << 20, 64 << 20])
            ops.append(("p2p", src, dst, size, rng.choice(["comm", "pp", "compute"]), rng.random() < 0.5))
        elif kind == "coll":
            op = rng.choice(["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "barrier"])
            ops.append(("coll", rng.choice(groups), op, rng.choice([1 << 12, 1 << 20, 1 << 24]),
                        rng.choice(["comm", "dp"]), rng.random() < 0.5))  # fmt: skip
        else:
            ops.append((kind, rng.randrange(world)))

    def program(gpu):
        r = gpu.rank
        made = {g: gpu.new_group(g) for g in groups if r in g}
        tag = 0
        for op in ops:
            kind = op[0]
            if kind == "compute" and op[1] == r:
                gpu.compute("work", duration_ns=op[2], stream=op[3])
            elif kind == "p2p":
                tag += 1
                _, src, dst, size, stream, wait = op
                if r == src:
                    gpu.send(dst, size, tag=tag, async_op=True, stream=stream)
                elif r == dst:
                    handle = gpu.recv(src, size, tag=tag, async_op=True, stream=stream)
                    if wait:
                        handle.wait()
            elif kind == "coll" and r in op[1]:
                _, group, name, size, stream, wait = op
                if name == "broadcast":
                    handle = gpu.broadcast(size, group[0], made[group], async_op=True, stream=stream)
                elif name == "barrier":
                    handle = gpu.barrier(made[group], async_op=True, stream=stream)
                else:
                    handle = getattr(gpu, name)(size, made[group], async_op=True, stream=stream)
                if wait:
                    handle.wait()
            elif kind == "sync" and op[1] == r:
                gpu.synchronize()
            elif kind == "mark":
                gpu.mark_iteration()
        gpu.synchronize()

    return program


@pytest.mark.parametrize("seed", range(48))
def test_random_programs_same_results_on_1_2_4_shards(seed):
    """Every figure of the run (wall clock and protocol counters aside) is the same on 1, 2 and 4
    shards; the engine asserts that no record arrives stamped before what its shard processed."""
    rng = random.Random(1000 + seed)
    nodes, gpus = rng.choice([(4, 1), (4, 2), (8, 1)])
    cluster = cluster_dict(nodes=nodes, gpus=gpus, nic_count=gpus, leaf_lat=rng.choice([1.0, 5.0]))
    program = random_program(seed, nodes * gpus)
    fast = rng.choice(["intra_node", "none"])
    runs = [run_program(program, cluster, shards=s, fast=fast)[0] for s in (1, 2, 4)]
    figures = [{k: v for k, v in r.items() if k not in WALL} for r in runs]
    assert figures[1] == figures[0] and figures[2] == figures[0]


SHIPPED = sorted((CONFIGS / "examples").glob("*.yaml")) + sorted((CONFIGS / "runs").glob("*.yaml"))
# the longest runs (minutes for the 1000+ GPU ones) are compared with fewer microbatches, layers or
# iterations: the same layout, schedule and features (llama3-8b, llama3-70b-zero3 and two-jobs at
# these sizes still fail with 20 us added to next_horizons' horizons, checked by hand)
SHORTER = {"megatron-1t-3072gpu": ["training.global_batch_size=96"],
           "gpt3-175b-1024gpu": ["training.global_batch_size=128"],
           "llama3-8b-64gpu": ["training.global_batch_size=64", "model.num_layers=8"],  # still 2 microbatches
           "gpt3-175b-nvidia-128gpu": ["training.global_batch_size=32"],
           "deepseek-v3-like-256gpu": ["training.global_batch_size=64"],
           "llama3-70b-zero3-64gpu": ["model.num_layers=4"],
           "llama31-70b-cp-64gpu": ["training.global_batch_size=16"],
           "two-jobs-shared-nics": ["jobs.0.training.iterations=1", "jobs.1.training.iterations=1"]}
# the larger sizes these three were compared at before (13, 9 and 8 s in the default suite): -m slow
LARGER = {"llama3-8b-64gpu": ["training.global_batch_size=64"],
          "llama3-70b-zero3-64gpu": ["model.num_layers=8"],
          "two-jobs-shared-nics": []}
SHIPPED_CASES = [pytest.param(p, SHORTER.get(p.stem, []), id=f"{p.parent.name}/{p.stem}") for p in SHIPPED] + [
    pytest.param(p, LARGER[p.stem], id=f"{p.parent.name}/{p.stem}-larger", marks=pytest.mark.slow)
    for p in SHIPPED if p.stem in LARGER]  # fmt: skip


@pytest.mark.parametrize(("path", "overrides"), SHIPPED_CASES)
def test_shipped_runs_same_results_on_1_2_4_shards(path, overrides):
    """Every shipped example and run: the same figures (or the same error) on 1, 2 and 4 shards."""
    config = load_run(path, overrides)
    outcomes = []
    for shards in (1, 2, 4):
        try:
            summary = execute(config, "inline", shards)[0]
            outcomes.append({k: v for k, v in summary.items() if k not in WALL})
        except EmulatorError as exc:
            outcomes.append(f"{type(exc).__name__}: {exc}")
    assert outcomes[1] == outcomes[0] and outcomes[2] == outcomes[0]


def queued_behind_program(gpu):
    """Ranks 0 and 1 (one shard) all-reduce twice on stream "dp", then rank 0 joins a collective
    with rank 2 (the other shard) on the same stream: its start is bounded by the time the two
    all-reduces need at least (their bytes over the members' links)."""
    near = gpu.new_group([0, 1]) if gpu.rank in (0, 1) else None
    far = gpu.new_group([0, 2]) if gpu.rank in (0, 2) else None
    if near is not None:
        for _ in range(2):
            gpu.all_reduce(64 << 20, near, async_op=True, stream="dp")
    if far is not None:
        gpu.all_reduce(1 << 20, far, async_op=True, stream="dp")
    # no synchronize(): a finished program launches nothing more, so only the queue bounds rank 0


@pytest.mark.parametrize("engine", ["compiled", "python"])
def test_collective_queued_behind_collectives(engine):
    """The bound for a cross-shard collective behind message-level collectives on its stream holds
    (an over-estimate lets the other shard run past the first message: the engine asserts), and
    the results are those of one shard."""
    cluster = cluster_dict(nodes=4, gpus=1, nic_count=1)
    one = run_program(queued_behind_program, cluster, shards=1, engine={"collective_engine": engine})[0]
    two = run_program(queued_behind_program, cluster, shards=2, engine={"collective_engine": engine})[0]
    assert {k: v for k, v in two.items() if k not in WALL} == {k: v for k, v in one.items() if k not in WALL}
    assert two["cross_shard_messages"] > 0


def test_bound_work_per_round_does_not_grow_with_the_queue(monkeypatch):
    """A program that runs far ahead queues many collectives on one stream; bounding them costs
    the same per round however long that queue is: per rank, one end bound for its compute stream
    and one per stream and destination shard (the bounds once walked the stream once per queued
    op: 40 iterations of the data-parallel example on 2 shards took minutes, ~600 per round)."""
    from emulator.engine import lookahead

    calls = {"n": 0}
    original = lookahead.end_bound

    def counted(*args):
        calls["n"] += 1
        return original(*args)

    monkeypatch.setattr(lookahead, "end_bound", counted)
    for iterations in (5, 40):
        calls["n"] = 0
        config = load_run(CONFIGS / "examples/data-parallel.yaml",
                          ["cluster.nodes=2", f"program_args.iterations={iterations}"])  # fmt: skip
        summary, _, _ = execute(config, shards=2)
        # 16 ranks, one stream with collectives each, one other shard: at most 2 bounds per rank
        assert calls["n"] <= 2 * 16 * summary["rounds"], (iterations, calls["n"] / summary["rounds"])
