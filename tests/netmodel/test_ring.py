"""Closed-form checks of the message-level network and the ring algorithm."""

import pytest

from tests.conftest import cluster_dict


def _allreduce(size):
    def program(gpu):
        gpu.all_reduce(size, gpu.new_group(range(gpu.args["n"]))) if gpu.rank < gpu.args["n"] else None

    return program


@pytest.mark.parametrize("fast", ["none", "intra_node"])
@pytest.mark.parametrize("n,size", [(2, 1 << 20), (4, 64 << 20), (8, 8 << 20), (8, 1000)])
def test_ring_allreduce_closed_form(run, n, size, fast):
    """Uncontended ring all-reduce on one tier takes 2(n-1)*(latency + S/(n*B)) within 1%, message by
    message (the reference) and on the intra-node fast path."""
    bw, lat_ns = 300.0, 2000
    summary, result, _ = run(_allreduce(size), cluster_dict(nodes=1, su_bw=bw), {"n": n}, fast=fast)
    expected = 2 * (n - 1) * (lat_ns + size / (n * bw))
    assert result.ranks[0].final_time_ns == pytest.approx(expected, rel=0.01)
    assert summary["bytes_by_tier"]["nvswitch"] == 2 * (n - 1) * -(-size // n) * n


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "barrier"])
def test_fast_path_matches_message_level(run, op):
    """The intra-node closed form gives the message-level time within 1% and the same bytes and sizes."""

    def program(gpu):
        kw = {"root": 0} if op == "broadcast" else {}
        if op == "barrier":
            gpu.barrier()
        else:
            getattr(gpu, op)(48 << 20, **kw)

    ref, ref_result, _ = run(program, cluster_dict(nodes=1), fast="none")
    fast, fast_result, _ = run(program, cluster_dict(nodes=1), fast="intra_node")
    assert fast["sim_time_s"] == pytest.approx(ref["sim_time_s"], rel=0.01)
    assert fast["bytes_by_tier"] == ref["bytes_by_tier"]
    assert fast["message_size_histogram"] == ref["message_size_histogram"]


def test_two_flows_sharing_a_link_take_twice_as_long(run):
    """Two streams of messages through the same NIC each take about twice as long as one alone."""

    def program(gpu):
        # ranks 0 and 1 of node 0 both send to node 1 through NIC 0 (nic count 1)
        if gpu.rank in gpu.args["senders"]:
            for _ in range(64):
                gpu.send(8 + gpu.rank, 1 << 20, async_op=True)
        elif gpu.rank - 8 in gpu.args["senders"]:
            for _ in range(64):
                gpu.recv(gpu.rank - 8, 1 << 20, async_op=True)

    cluster = cluster_dict(nodes=2, nic_count=1, nic_gbps=100)
    _, alone, _ = run(program, cluster, {"senders": [0]})
    _, shared, _ = run(program, cluster, {"senders": [0, 1]})
    t_alone = alone.ranks[8].final_time_ns
    t_shared = min(shared.ranks[8].final_time_ns, shared.ranks[9].final_time_ns)
    assert t_shared / t_alone == pytest.approx(2.0, rel=0.05)


def test_link_bytes_and_busy_time_are_recorded(run):
    """A 1 MiB message crossing nodes occupies the sender's and receiver's NIC for S/B each."""

    def program(gpu):
        if gpu.rank == 0:
            gpu.send(8, 1 << 20)
        elif gpu.rank == 8:
            gpu.recv(0, 1 << 20)

    _, result, topo = run(program, cluster_dict(nodes=2, nic_gbps=200))
    tx, rx = topo.nic_tx[0][0], topo.nic_rx[1][0]
    for link in (tx, rx):
        nbytes, busy, messages, _ = result.links[link]
        assert nbytes == 1 << 20 and messages == 1
        assert busy == pytest.approx((1 << 20) / 25.0, abs=1)
    # delivery = serialisation + the leaf tier's latency
    assert result.ranks[8].final_time_ns == pytest.approx((1 << 20) / 25.0 + 5000, abs=2)
