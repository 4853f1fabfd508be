"""Every algorithm completes, moves the bytes it should, and fails clearly when misused."""

import pytest

from emulator.errors import ConfigError
from netmodel.collectives import ALGORITHMS, get_algorithm
from tests.conftest import cluster_dict

CASES = [
    ("ring", "all_reduce"), ("ring", "reduce_scatter"), ("ring", "all_gather"), ("ring", "broadcast"),
    ("ring", "reduce"), ("tree", "all_reduce"), ("halving_doubling", "all_reduce"),
    ("halving_doubling", "reduce_scatter"), ("halving_doubling", "all_gather"), ("pairwise", "all_to_all"),
    ("direct", "all_to_all"), ("hierarchical", "all_reduce"), ("dissemination", "barrier"),
]  # fmt: skip


def _program(gpu):
    a = gpu.args
    if gpu.rank >= a["n"]:
        return
    group = gpu.new_group(range(a["n"]))
    for _ in range(2):  # twice: messages of consecutive calls must not be confused
        if a["op"] == "barrier":
            gpu.barrier(group, algo=a["algo"])
        elif a["op"] in ("broadcast", "reduce"):
            getattr(gpu, a["op"])(a["size"], root=1, group=group, algo=a["algo"])
        else:
            getattr(gpu, a["op"])(a["size"], group, algo=a["algo"])
    gpu.mark_iteration()


@pytest.mark.parametrize("algo,op", CASES)
@pytest.mark.parametrize("n", [2, 5, 8, 16])
def test_algorithm_completes(run, algo, op, n):
    """Each algorithm finishes on power-of-two and other group sizes, within and across nodes."""
    args = {"n": n, "op": op, "algo": algo, "size": 1 << 20}
    summary, result, _ = run(_program, cluster_dict(nodes=2), args, fast="none")
    assert summary["iterations"] == 1
    assert all(r.final_time_ns > 0 for r in result.ranks[:n])


def test_ring_allreduce_bytes():
    """A ring all-reduce sends 2(n-1)/n * S per member."""
    from tests.conftest import run_program

    n, size = 8, 8 << 20
    summary, _, _ = run_program(_program, cluster_dict(nodes=1), {"n": n, "op": "all_reduce", "algo": "ring",
                                                                  "size": size})  # fmt: skip
    assert sum(summary["bytes_by_tier"].values()) == 2 * 2 * (n - 1) * size  # two calls


def test_hierarchical_network_bytes(run):
    """Hierarchical all-reduce over k nodes of m GPUs puts 2(k-1)/k * S/m per GPU on the network."""
    k, m, size = 8, 8, 64 << 20
    summary, _, _ = run(_program, cluster_dict(nodes=k), {"n": k * m, "op": "all_reduce", "algo": "hierarchical",
                                                          "size": size})  # fmt: skip
    per_call = k * m * 2 * (k - 1) * (size // m // k)
    assert summary["bytes_by_tier"]["leaf"] == 2 * per_call
    assert summary["bytes_by_tier"]["nvswitch"] == 2 * 2 * k * m * (m - 1) * (size // m)


def test_unknown_algorithm_lists_known():
    with pytest.raises(ConfigError, match="known: .*ring"):
        get_algorithm("rings", "all_reduce")


def test_algorithm_without_op_lists_those_that_have_it():
    with pytest.raises(ConfigError, match="algorithms that do: .*pairwise"):
        get_algorithm("ring", "all_to_all")


def test_registry_names_match():
    assert all(name == algo.name for name, algo in ALGORITHMS.items())
