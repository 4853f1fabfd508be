"""trace.json: valid Chrome Trace Event JSON with compute, communication and waiting slices."""

from __future__ import annotations

import json

from emulator.results.trace import trace_document, wait_slices
from tests.conftest import cluster_dict
from tests.emulator.conftest import DP, DP_SMALL, cli_run

PHASES = {"M", "X", "i", "C"}


def _events(run_dir):
    doc = json.loads((run_dir / "trace.json").read_text())
    assert set(doc) == {"traceEvents", "otherData"}
    return doc["traceEvents"]


def test_trace_is_valid_trace_event_json(dp_dir):
    """Every event has a known phase, integer pid/tid and non-negative microsecond ts/dur."""
    events = _events(dp_dir)
    assert events
    for e in events:
        assert e["ph"] in PHASES and isinstance(e["pid"], int) and isinstance(e["name"], str)
        if e["ph"] in ("X", "i"):
            assert isinstance(e["tid"], int) and e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] > 0
    # a process per node, a thread per GPU stream, named by metadata events
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {0: "node 0", 4: "network"}  # default: the first node's GPUs (+ the network counters)
    threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads == {f"gpu {r} {s}" for r in range(8) for s in ("compute", "comm")}


def test_trace_has_compute_communication_and_wait_slices(dp_dir):
    """Rank 0's tracks hold its forward/backward compute, all-reduces, waits and utilisation counters."""
    events = _events(dp_dir)
    tids = {e["args"]["name"]: e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    compute = [e for e in events if e["ph"] == "X" and e["tid"] == tids["gpu 0 compute"] and e["pid"] == 0]
    comm = [e for e in events if e["ph"] == "X" and e["tid"] == tids["gpu 0 comm"] and e["pid"] == 0]
    assert [e["name"] for e in compute if e["cat"] == "compute"] == ["forward", "backward.half1", "backward.half2",
                                                                       "optimizer"] * 2  # fmt: skip
    assert len(comm) == 4 and all(e["cat"] == "collective" and e["name"].startswith("all_reduce") for e in comm)
    waits = [e for e in compute if e["cat"] == "wait"]
    # the optimizer waits for the second all-reduce: the wait ends when it does
    assert [e["name"] for e in waits] == ["wait comm"] * 2
    for w in waits:
        assert any(abs(c["ts"] + c["dur"] - (w["ts"] + w["dur"])) < 1e-6 for c in comm)
    marks = [
        e for e in events if e["ph"] == "i" and e["name"] == "mark_iteration" and e["tid"] == tids["gpu 0 compute"]
    ]
    assert len(marks) == 2
    assert any(e["ph"] == "C" and e["name"] == "utilisation ib-spine" for e in events)


def test_trace_ranks_select_what_is_traced(tmp_path):
    """--trace-ranks none writes no slices; a list traces exactly those ranks, grouped by node."""
    cli_run(tmp_path / "none", DP, *DP_SMALL, "--trace-ranks", "none")
    assert not [e for e in _events(tmp_path / "none") if e["ph"] == "X"]
    cli_run(tmp_path / "some", DP, *DP_SMALL, "--trace-ranks", "1,9-10")
    events = _events(tmp_path / "some")
    threads = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert {name.split()[1] for _, name in threads} == {"1", "9", "10"}
    assert {pid for pid, _ in threads} == {0, 1}


def test_wait_slices_name_the_stream_that_released_the_wait():
    """Gaps on the compute stream become waits named after the stream, bubble for "pp"."""
    ops = [("compute", "a", 0, 0, 10), ("pp", "recv", 2, 0, 30), ("compute", "b", 0, 30, 40),
           ("compute", "c", 0, 55, 60)]  # fmt: skip
    assert wait_slices(ops) == [("bubble pp", 10, 30), ("wait", 40, 55)]


def test_trace_document_of_a_program(run):
    """trace_document works on raw results: one X event per timed operation of each traced rank."""

    def program(gpu):
        gpu.compute("work", duration_ns=1000)
        gpu.all_reduce(1 << 20)
        gpu.compute("more", duration_ns=500)

    _, result, topo = run(program, cluster_dict(nodes=1, gpus=4), trace_ranks=[2])
    doc = trace_document(result, topo)
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [e["name"].split()[0] for e in slices if e["cat"] != "wait"] == ["work", "all_reduce", "more"]
    assert doc["otherData"]["traced_ranks"] == [2]
    json.dumps(doc)  # serialisable as is


def test_streamed_trace_is_the_document_json_dumps_writes(dp_dir, tmp_path):
    """write_trace streams f-string texts: byte for byte what json.dumps of the document writes, also
    for names that need escaping, instant events and the utilisation counters."""
    from emulator.config.loader import load_run
    from emulator.engine.result import RunResult
    from emulator.results.rundir import read_run_dir
    from emulator.results.trace import write_trace
    from netmodel.topology import Topology

    topo = Topology(load_run(dp_dir / "config.yaml").cluster)
    timeline = read_run_dir(dp_dir).timeline
    ops = [("compute", 'fwd "a"\\b', 0, 0, 1500), ("compute", "münchen ✓", 0, 1700, 1_000_000_000_007),
           ("comm", "all_reduce #0", 3, 10, 1600), ("compute", "mark_iteration", 6, 1600, 1600),
           ("pp.recv.fwd0", "recv(src=3)", 2, 0, 1700)]  # fmt: skip
    result = RunResult(world_size=topo.world_size, ranks=[], links={}, tier_bytes=[], tier_messages=[], size_hist=[],
                       events=0, rounds=0, cross_shard_messages=0, traces={9: ops, 1: ops[:3]})  # fmt: skip
    meta = {"name": "x\ty", "fingerprint": "f00"}
    path = tmp_path / "trace.json"
    write_trace(path, result, topo, timeline, meta)
    expected = json.dumps(trace_document(result, topo, timeline, meta), separators=(",", ":")) + "\n"
    assert path.read_text() == expected
    assert any(e["ph"] == "C" for e in json.loads(expected)["traceEvents"])  # the counters were compared too
    write_trace(path, RunResult(world_size=1, ranks=[], links={}, tier_bytes=[], tier_messages=[], size_hist=[],
                                events=0, rounds=0, cross_shard_messages=0), topo)  # fmt: skip
    assert json.loads(path.read_text()) == {"traceEvents": [], "otherData": {"traced_ranks": []}}


def test_streamed_trace_of_peers_that_differ_in_a_few_names(dp_dir, tmp_path):
    """A folded group's peers repeat the previous rank's operations but for their sends' and
    receives' names: the names reused from the previous rank where the operations are equal, looked
    up where they differ (a few, or most: a rank of its own), give json.dumps's bytes."""
    from emulator.config.loader import load_run
    from emulator.engine.result import RunResult
    from emulator.results.trace import write_trace
    from netmodel.topology import Topology

    topo = Topology(load_run(dp_dir / "config.yaml").cluster)
    base = [("compute", f"layer{i % 7} fwd", 0, 100 * i, 100 * i + 60) for i in range(40)]
    base += [("pp.send.fwd", "send(dst=8)", 1, 4100, 4300), ("compute", "mark_iteration", 6, 4300, 4300)]
    peer = [(s, n.replace("dst=8", "dst=9"), k, a, b) for s, n, k, a, b in base]  # one name differs
    own = [(s, f"{n} own", k, a, b) for s, n, k, a, b in base]  # every name differs
    shorter = base[:-1]
    traces = {0: base, 1: peer, 2: list(peer), 3: own, 4: shorter, 5: [(s, n, 2, a, b) for s, n, _, a, b in shorter]}
    result = RunResult(world_size=topo.world_size, ranks=[], links={}, tier_bytes=[], tier_messages=[], size_hist=[],
                       events=0, rounds=0, cross_shard_messages=0, traces=traces)  # fmt: skip
    path = tmp_path / "trace.json"
    write_trace(path, result, topo)
    assert path.read_text() == json.dumps(trace_document(result, topo), separators=(",", ":")) + "\n"
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] in "Xi" and e.get("cat") != "wait"]
    assert sum(e["name"] == "send(dst=9)" for e in events) == 2 and sum(e["cat"] == "recv" for e in events) == 41
