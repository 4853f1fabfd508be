"""Rounds that the shards run among themselves (actors/peer.py), without Ray: each shard in a thread
of its own, the shards connected by real TCP sockets on 127.0.0.1, driven by the coordinator's
``drive`` as the Ray backend drives them. The rounds must be exactly those of the driver's protocol:
same count, same figures, same errors."""

from __future__ import annotations

import random
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from actors.peer import Mesh, PeerLost, PeerRounds
from actors.shard_actor import decode_records, encode_records
from emulator.config.schema import RunConfig
from emulator.config.typed import from_dict
from emulator.engine.coordinator import drive, first_error
from emulator.engine.placement import shard_layout
from emulator.engine.result import export_shard
from emulator.engine.settings import EngineSettings
from emulator.engine.shard import Shard
from emulator.errors import BackendError, EmulatorError, OutOfMemoryError, ProgramError
from emulator.results.summary import summarize
from netmodel.topology import Topology
from tests.conftest import cluster_dict, run_program
from tests.emulator.test_lookahead import WALL, pipeline_program, random_program


class ThreadedDirectTransport:
    """A ``DirectTransport`` whose shards live in threads of this process (one thread per shard for
    the run's life: the rank programs are greenlets, bound to the thread that made them)."""

    exchanges_directly = True

    def __init__(self, config, topo, shards: int, program):
        settings = EngineSettings.from_run_config(config)
        layout, rank_shard = shard_layout(topo, shards, settings)
        self.shards, self.world_size = len(layout), topo.world_size
        self.lookahead_ns = topo.min_cross_node_latency_ns()
        self.threads = [ThreadPoolExecutor(1) for _ in layout]
        self.objs = [Shard(topo, ranks, rank_shard, i, program, settings, {}, run_config=config)
                     for i, ranks in enumerate(layout)]  # fmt: skip
        self.meshes = [Mesh(i, self.shards, "127.0.0.1") for i in range(self.shards)]
        self.peers: list[PeerRounds] = []
        self.reached = None

    def _all(self, fn) -> list:
        futures = [pool.submit(fn, i) for i, pool in enumerate(self.threads)]
        return [f.result(timeout=60) for f in futures]  # the first error in shard order; a hang fails

    def start(self) -> None:
        addresses = [m.address for m in self.meshes]
        self._all(lambda i: self.meshes[i].connect(addresses, 10.0))
        self.peers = [PeerRounds(s, i, self.shards, self.meshes[i], self.lookahead_ns, encode_records, decode_records)
                      for i, s in enumerate(self.objs)]  # fmt: skip
        self._all(lambda i: self.peers[i].begin(self.objs[i].start()))

    def advance(self, budget_s: float, want_stats: bool):
        # as ShardPool.call: every shard's answer, then the first of their errors in event order
        futures = [pool.submit(self.peers[i].run, budget_s) for i, pool in enumerate(self.threads)]
        replies, errors = [], []
        for f in futures:
            try:
                replies.append(f.result(timeout=60))  # a hang fails
            except EmulatorError as exc:
                errors.append(exc)
        if errors:
            raise first_error(errors)
        assert len({r["status"] for r in replies}) == 1
        return replies[0]["status"] == "done", replies[0]["counters"], [None] * self.shards

    def finish(self):
        out = self._all(lambda i: (self.objs[i].blocked(), export_shard(self.objs[i]), {}))
        self.close()
        return out

    def salvage(self, lost):
        for mesh in self.meshes:
            mesh.abort()
        self.reached = min(p.counters() for p in self.peers) if self.peers else None
        out = [export_shard(s) for s in self.objs]
        self.close()
        return out

    def close(self) -> None:
        for mesh in self.meshes:
            mesh.close()
        for pool in self.threads:
            pool.shutdown(wait=False)


def run_direct(program, cluster: dict, shards: int, fast: str = "intra_node"):
    config = from_dict(RunConfig, {"program": "inline:program", "cluster": cluster,
                                   "engine": {"fast_collectives": fast}}, "")  # fmt: skip
    topo = Topology(config.cluster)
    transport = ThreadedDirectTransport(config, topo, shards, program)
    result = drive(transport, transport.lookahead_ns)
    return summarize(result, topo, 1.0, "inline", shards)


def same(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k not in WALL} == {k: v for k, v in b.items() if k not in WALL}


@pytest.mark.parametrize("seed", range(12))
def test_random_programs_same_rounds_and_results_as_the_driver(seed):
    """Random programs (tests/emulator/test_lookahead.py) on 2 and 4 shards: the rounds the shards
    run among themselves are the driver's, one for one, and every figure is the same."""
    rng = random.Random(2000 + seed)
    nodes, gpus = rng.choice([(4, 1), (4, 2), (8, 1)])
    cluster = cluster_dict(nodes=nodes, gpus=gpus, nic_count=gpus, leaf_lat=rng.choice([1.0, 5.0]))
    program = random_program(seed, nodes * gpus)
    fast = rng.choice(["intra_node", "none"])
    for shards in (2, 4):
        driven = run_program(program, cluster, shards=shards, fast=fast)[0]
        direct = run_direct(program, cluster, shards, fast)
        assert same(direct, driven)
        assert direct["rounds"] == driven["rounds"] and direct["cross_shard_messages"] == driven["cross_shard_messages"]


def test_pipeline_rounds_and_pauses():
    """A pipeline of 4 shards, paused every round or so (a budget of 0 s): the same figures and
    rounds, and pauses do not add rounds."""
    cluster = cluster_dict(nodes=4, gpus=1)
    driven = run_program(pipeline_program, cluster, shards=4)[0]
    config = from_dict(RunConfig, {"program": "inline:program", "cluster": cluster}, "")
    topo = Topology(config.cluster)
    transport = ThreadedDirectTransport(config, topo, 4, pipeline_program)
    advances = []
    real = transport.advance

    def advance(budget_s, want_stats):
        advances.append(budget_s)
        return real(0.0, want_stats)  # shard 0 asks for a pause after every round

    transport.advance = advance
    direct = summarize(drive(transport, transport.lookahead_ns), topo, 1.0, "inline", 4)
    assert same(direct, driven) and direct["rounds"] == driven["rounds"] > 100
    assert len(advances) == driven["rounds"] + 2  # the start's exchange, a call per round, the end


def oom_on_shard(gpu):
    """Rank 3 (on the last of 2 shards) allocates more than a GPU holds after a message round trip."""
    if gpu.rank == 0:
        gpu.send(3, 1 << 20)
        gpu.recv(3, 1 << 20)
    elif gpu.rank == 3:
        gpu.recv(0, 1 << 20)
        gpu.send(0, 1 << 20)
        gpu.alloc(1 << 50, "huge")
    gpu.synchronize()


def test_a_shards_error_stops_every_shard_and_keeps_what_ran():
    """The OOM of a rank on shard 1 is the run's error, with the driver's message; every shard
    stops after that round (no thread left waiting) and the partial result holds both shards."""
    cluster = cluster_dict(nodes=4, gpus=1)
    with pytest.raises(OutOfMemoryError) as driven:
        run_program(oom_on_shard, cluster, shards=2)
    with pytest.raises(OutOfMemoryError) as direct:
        run_direct(oom_on_shard, cluster, 2)
    assert str(direct.value) == str(driven.value)
    assert direct.value.partial_result is not None and direct.value.round_stats.rounds >= 2


def two_ooms(gpu):
    """Rank 0 (shard 0 of 2) runs out of memory after rank 2 (shard 1) does; no message crosses,
    so both meet their error in the same (the only) round."""
    if gpu.rank in (0, 2):
        gpu.compute("work", duration_ns=2000 if gpu.rank == 0 else 1000)
        gpu.alloc(1 << 50, "huge")
    gpu.synchronize()


def test_the_first_error_in_event_order_is_raised_not_the_lowest_shards():
    cluster = cluster_dict(nodes=4, gpus=1)
    with pytest.raises(OutOfMemoryError, match="on rank 2 at") as one:
        run_program(two_ooms, cluster, shards=1)
    with pytest.raises(OutOfMemoryError) as driven:
        run_program(two_ooms, cluster, shards=2)
    with pytest.raises(OutOfMemoryError) as direct:
        run_direct(two_ooms, cluster, 2)
    assert str(driven.value) == str(direct.value) == str(one.value)
    assert driven.value.round_stats.rounds == 0  # the error's round (the first) is not counted


def failing_program(gpu):
    if gpu.rank == 2:
        gpu.compute("work", duration_ns=1000)
        raise ValueError("boom")
    gpu.all_reduce(1 << 20)
    gpu.synchronize()


def test_program_error_names_the_rank():
    with pytest.raises(ProgramError, match="rank 2"):
        run_direct(failing_program, cluster_dict(nodes=4, gpus=1), 2)


def connected(n: int) -> list[Mesh]:
    meshes = [Mesh(i, n, "127.0.0.1") for i in range(n)]
    addresses = [m.address for m in meshes]
    threads = [threading.Thread(target=m.connect, args=(addresses, 5.0)) for m in meshes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return meshes


def test_large_frames_cross_without_waiting_on_each_other():
    """Two shards sending each other frames far larger than a socket buffer at once (a round with
    many records): both exchanges complete, bytes intact, the next round's frame kept apart."""
    a, b = connected(2)
    big_a, big_b = bytes(range(256)) * 40_000, bytes(reversed(range(256))) * 50_000
    out = {}
    ta = threading.Thread(target=lambda: out.update(a=(a.exchange({1: big_a}), a.exchange({1: b"x"}))))
    tb = threading.Thread(target=lambda: out.update(b=(b.exchange({0: big_b}), b.exchange({0: b"y"}))))
    ta.start(), tb.start()
    ta.join(10), tb.join(10)
    assert out["a"] == ({1: big_b}, {1: b"y"}) and out["b"] == ({0: big_a}, {0: b"x"})
    a.close(), b.close()


def test_a_lost_peer_and_an_abort_end_the_exchange():
    """A peer whose socket closes (its process died) is PeerLost; ``abort`` from another thread wakes
    a shard waiting on a peer that never answers (a frozen host)."""
    a, b, c = connected(3)
    for sock in c.peers.values():
        sock.close()
    with pytest.raises(PeerLost) as lost:
        a.exchange({1: b"", 2: b""})
    assert lost.value.peer == 2
    d, e = connected(2)  # e never sends
    timer = threading.Timer(0.2, d.abort)
    timer.start()
    with pytest.raises(PeerLost):
        d.exchange({1: b"frame"})
    timer.join()
    assert d.aborted
    for mesh in (a, b, c, d, e):
        mesh.close()


def test_mesh_listens_on_the_given_host():
    mesh = Mesh(0, 2, "127.0.0.1")
    assert mesh.address[0] == "127.0.0.1" and mesh.address[1] > 0
    with socket.create_connection(mesh.address, timeout=2):
        pass
    mesh.close()


def test_unreachable_peer_is_one_line():
    """A shard that cannot reach another (a firewall between hosts) says so, naming both and the way out."""
    closed = Mesh(0, 2, "127.0.0.1")
    address = closed.address
    closed.close()  # nobody listens there any more
    mesh = Mesh(1, 2, "127.0.0.1")
    with pytest.raises(BackendError, match=r"^shard 1 cannot connect to shard 0 at 127.0.0.1:\d+ .*ray_rounds=calls$"):
        mesh.connect([address, mesh.address], 2.0)
    mesh.close()
    lonely = Mesh(0, 2, "127.0.0.1")
    with pytest.raises(BackendError, match=r"^shard 0 at 127.0.0.1:\d+ heard from no shard of \[1\] within 0 s"):
        lonely.connect([lonely.address, None], 0.2)
    lonely.close()
