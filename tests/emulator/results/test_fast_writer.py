"""timeline.csv and trace.json as the column-wise writer formats them are, byte for byte, what the
plain statement of their format gives: dicts per row and per event through ``csv.DictWriter`` and
``json.dumps`` (the reference below, the writer of main at 58fa23a written out), on fuzzed results."""

from __future__ import annotations

import csv
import io
import json
import random

import pytest

from emulator.config.loader import load_run
from emulator.engine.folding import replicate_trace
from emulator.engine.ops import KIND_NAMES
from emulator.engine.result import RunResult
from emulator.results.rundir import write_results
from emulator.results.tables import TIMELINE_COLUMNS, TimelineColumns, bucket_seconds, round6
from emulator.results.tables import sender_capacity_bytes_per_ns as capacity_per_ns
from emulator.results.trace import trace_event_texts, wait_slices, write_trace
from netmodel.topology import Topology


def reference_timeline_rows(result: RunResult, topo) -> list[dict]:
    tiers = len(topo.tier_names)
    cap = capacity_per_ns(topo)
    rows = []
    for tier in range(tiers):
        own = result.timeline[tier]
        carried = dict(own)
        for t in range(tier + 1, tiers) if tier else ():
            for slot, nbytes in result.timeline[t].items():
                carried[slot] = carried.get(slot, 0) + nbytes
        capacity = cap[tier] * result.bucket_ns
        for slot, link_bytes in sorted(carried.items()):
            rows.append({"tier": topo.tier_names[tier], "bucket": slot, "start_s": slot * result.bucket_ns / 1e9,
                         "end_s": (slot + 1) * result.bucket_ns / 1e9, "message_bytes": own.get(slot, 0),
                         "link_bytes": link_bytes,
                         "utilisation": round(link_bytes / capacity, 6) if capacity else 0.0})  # fmt: skip
    return rows


def reference_csv(rows: list[dict]) -> str:
    f = io.StringIO(newline="")
    writer = csv.DictWriter(f, fieldnames=TIMELINE_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    return f.getvalue()


def reference_trace(result: RunResult, topo, rows: list[dict], metadata: dict) -> str:
    events: list[dict] = []
    next_tid: dict[int, int] = {}
    for rank in sorted(result.traces):
        ops = result.traces[rank]
        node = topo.rank_node[rank]
        if node not in next_tid:
            next_tid[node] = 0
            events.append({"ph": "M", "name": "process_name", "pid": node, "args": {"name": f"node {node}"}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": node, "args": {"sort_index": node}})
        streams = sorted({op[0] for op in ops}, key=lambda s: (s != "compute", s))
        tids = {s: next_tid[node] + i for i, s in enumerate(streams)}
        next_tid[node] += len(streams)
        for stream, tid in tids.items():
            events.append({"ph": "M", "name": "thread_name", "pid": node, "tid": tid,
                           "args": {"name": f"gpu {rank} {stream}"}})  # fmt: skip
            events.append({"ph": "M", "name": "thread_sort_index", "pid": node, "tid": tid,
                           "args": {"sort_index": tid}})  # fmt: skip
        for stream, name, kind, start, end in ops:
            event = {"name": name, "cat": KIND_NAMES[kind], "pid": node, "tid": tids[stream], "ts": start / 1000.0}
            event.update({"ph": "X", "dur": (end - start) / 1000.0} if end > start else {"ph": "i", "s": "t"})
            events.append(event)
        if "compute" in tids:
            for name, start, end in wait_slices(ops):
                events.append({"ph": "X", "name": name, "cat": "wait", "pid": node, "tid": tids["compute"],
                               "ts": start / 1000.0, "dur": (end - start) / 1000.0})  # fmt: skip
    if rows:
        pid = topo.num_nodes
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": "network"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
        by_tier: dict[str, list[dict]] = {}
        for row in rows:
            by_tier.setdefault(row["tier"], []).append(row)
        for tier, tier_rows in by_tier.items():
            for i, row in enumerate(tier_rows):
                events.append({"ph": "C", "name": f"utilisation {tier}", "pid": pid, "ts": row["start_s"] * 1e6,
                               "args": {"utilisation": row["utilisation"]}})  # fmt: skip
                if i == len(tier_rows) - 1 or tier_rows[i + 1]["bucket"] != row["bucket"] + 1:
                    events.append({"ph": "C", "name": f"utilisation {tier}", "pid": pid, "ts": row["end_s"] * 1e6,
                                   "args": {"utilisation": 0}})  # fmt: skip
    doc = {"traceEvents": events, "otherData": {"traced_ranks": sorted(result.traces), **metadata}}
    return json.dumps(doc, separators=(",", ":")) + "\n"


NAMES = ["fwd.attn", 'fwd "a"\\b', "münchen ✓", "send(dst=3)", "recv(src=1)", "all_reduce group[0,2,...]",
         "alloc(x)", "mark_iteration", "tab\there"]  # fmt: skip
STREAMS = ["compute", "comm", "pp.recv.fwd0", "tp", "dp.grad"]


def _ops(rng: random.Random, n: int) -> list[tuple]:
    ops = []
    for _ in range(n):
        start = rng.choice([0, rng.randrange(10**4), rng.randrange(10**13), 1_000_000_000_007,
                            # past 15 digits (repr's shortest text is not the decimal), past int64
                            10**15 + rng.randrange(10**4), 2**53 + 1, *([2**64 + 5] if rng.random() < 0.02 else [])])
        end = start + rng.choice([0, 1, rng.randrange(10**6), rng.randrange(10**12)])
        ops.append((rng.choice(STREAMS), rng.choice(NAMES) + rng.choice(["", f" mb{rng.randrange(4)}"]),
                    rng.randrange(len(KIND_NAMES)), start, end))  # fmt: skip
    return ops


def _timeline(rng: random.Random, tiers: int) -> list[dict[int, int]]:
    out = []
    for _ in range(tiers):
        line: dict[int, int] = {}
        slot = rng.choice([0, rng.randrange(100), rng.randrange(10**9)])
        for _ in range(rng.randrange(0, 300)):
            slot += rng.choice([1, 1, 1, 2, rng.randrange(1, 50), rng.randrange(1, 10**7)])
            line[slot] = rng.choice([1, rng.randrange(1, 2**20), rng.randrange(1, 2**50), 2**53 + 1])
        out.append(line)
    return out


def _fuzzed(rng: random.Random, topo) -> RunResult:
    base = _ops(rng, rng.randrange(0, 200))
    traces = {0: base, 1: replicate_trace(base, 1, 2), 2: [(s, rng.choice(NAMES), k, a, b) for s, _, k, a, b in base],
              3: _ops(rng, rng.randrange(0, 50)), 9: _ops(rng, 30),
              # as long as the representative's, other times; other streams (other wait slices)
              4: [(s, n, k, a + 1, b + 2) for s, n, k, a, b in base]}  # fmt: skip
    traces[5] = [(rng.choice(STREAMS), n, k, a, b) for _, n, k, a, b in traces[4]]  # rank 4's times, other streams
    for rank in rng.sample(sorted(traces), rng.randrange(0, 3)):
        del traces[rank]
    return RunResult(world_size=topo.world_size, ranks=[], links={}, tier_bytes=[0] * len(topo.tier_names),
                     tier_messages=[0] * len(topo.tier_names), size_hist=[{} for _ in topo.tier_names], events=0,
                     rounds=0, cross_shard_messages=0, timeline=_timeline(rng, len(topo.tier_names)),
                     bucket_ns=rng.choice([1_000_000, 100_000, 7, 1_000_000_007]), traces=traces)  # fmt: skip


@pytest.mark.parametrize("seed", range(12))
def test_run_directory_files_are_the_reference_bytes(dp_dir, tmp_path, seed):
    config = load_run(dp_dir / "config.yaml")
    topo = Topology(config.cluster)
    result = _fuzzed(random.Random(seed), topo)
    meta = {"name": "fuzz\u00e9", "fingerprint": "f00"}
    out, data = write_results(tmp_path / "run", config, meta, result, topo)
    rows = reference_timeline_rows(result, topo)
    assert repr(data.timeline) == repr(rows)  # the same values and types (0.0 is not 0)
    assert (out / "timeline.csv").read_bytes() == reference_csv(rows).encode()
    assert (out / "trace.json").read_text() == reference_trace(result, topo, rows, meta)


def test_no_traffic_no_counters(dp_dir, tmp_path):
    config = load_run(dp_dir / "config.yaml")
    topo = Topology(config.cluster)
    result = _fuzzed(random.Random(3), topo)
    result.timeline = [{} for _ in topo.tier_names]
    out, data = write_results(tmp_path / "run", config, {}, result, topo)
    assert data.timeline == []
    assert (out / "trace.json").read_text() == reference_trace(result, topo, [], {"name": "", "fingerprint": ""})
    assert '"network"' not in (out / "trace.json").read_text()


def test_trace_from_rows_of_any_order_and_values(dp_dir, tmp_path):
    """Timeline rows read back (dicts), tiers interleaved, a value json writes differently from str."""
    topo = Topology(load_run(dp_dir / "config.yaml").cluster)
    result = _fuzzed(random.Random(99), topo)
    rows = [{"tier": t, "bucket": b, "start_s": b / 1000, "end_s": (b + 1) / 1000, "message_bytes": 1,
             "link_bytes": 2, "utilisation": u} for t, b, u in
            [("leaf", 3, 0.5), ("nvswitch", 1, 1), ("leaf", 4, float("inf")), ("leaf", 6, 0.25),
             ("nvswitch", 2, 0.0)]]  # fmt: skip
    write_trace(tmp_path / "t.json", result, topo, rows, {})
    assert (tmp_path / "t.json").read_text() == reference_trace(result, topo, rows, {})
    cols = TimelineColumns.from_rows(rows)
    assert list(trace_event_texts(result, topo, cols)) == list(trace_event_texts(result, topo, rows))
    assert cols.rows() == rows


def test_round6_is_pythons_round():
    rng = random.Random(5)
    cases = [([j for j in range(0, 4000)], 128.0),  # j / 2**7: x * 10**6 is a half-integer for every odd j
             ([j for j in range(0, 4000)], 2.0**20), ([0, 1, 2**52, 2**53 - 1, 2**53, 2**60], 3.0),
             ([rng.randrange(2**50) for _ in range(20000)], rng.uniform(1e3, 1e12)),
             ([rng.randrange(10**6) for _ in range(20000)], 1e6), ([5, 15, 25, 35], 1e7), ([7], -3.0),
             ([], 1.0)]  # fmt: skip
    for _ in range(200):
        divisor = rng.choice([rng.uniform(0.1, 1e9), float(rng.randrange(1, 10**7)), 2.0 ** rng.randrange(-5, 40)])
        cases.append(([rng.randrange(int(divisor * 3) + 2) for _ in range(200)], divisor))
    for values, divisor in cases:
        assert repr(round6(values, divisor)) == repr([round(v / divisor, 6) for v in values]), divisor


def test_bucket_seconds_are_pythons_floats():
    for first, last, bucket_ns in [(0, 5000, 1_000_000), (17, 30_000, 7), (0, 100, 1_000_000_007),
                                   (2**40, 2**40 + 10, 10**6), (-3, 3, 100)]:  # fmt: skip
        expected = [slot * bucket_ns / 1e9 for slot in range(first, last + 1)]
        assert repr(bucket_seconds(first, last, bucket_ns)) == repr(expected)


def _dense_timeline(rng: random.Random, tiers: int) -> list[dict[int, int]]:
    """Slots close together (the numpy path of timeline_columns), the tiers' slots overlapping."""
    base = rng.choice([0, rng.randrange(100), rng.randrange(10**9)])
    out = []
    for _ in range(tiers):
        slots = rng.sample(range(base, base + 400), rng.randrange(0, 300))
        out.append({slot: rng.choice([1, rng.randrange(1, 2**20), rng.randrange(1, 2**50), 2**53 + 1])
                    for slot in slots})  # fmt: skip
    return out


@pytest.mark.parametrize("seed", range(8))
def test_timeline_columns_by_numpy_are_the_reference_rows(dp_dir, tmp_path, seed):
    """Dense buckets, counts to 2**53 + 1, any bucket size: the arrays' rows are the Python statement's
    (the same ints and floats), and so are the files."""
    from emulator.results.tables import timeline_columns

    config = load_run(dp_dir / "config.yaml")
    topo = Topology(config.cluster)
    rng = random.Random(seed)
    result = _fuzzed(rng, topo)
    result.timeline = _dense_timeline(rng, len(topo.tier_names))
    cols = timeline_columns(result, topo)
    assert not cols.bucket or ("array", "bucket") in cols._texts  # the numpy path ran
    rows = reference_timeline_rows(result, topo)
    assert repr(cols.rows()) == repr(rows)
    out, _ = write_results(tmp_path / "run", config, {"name": "x", "fingerprint": "y"}, result, topo)
    assert (out / "timeline.csv").read_bytes() == reference_csv(rows).encode()
    assert (out / "trace.json").read_text() == reference_trace(result, topo, rows, {"name": "x", "fingerprint": "y"})


def reference_link_rows(result: RunResult, topo) -> list[dict]:
    """links.csv's rows as main at 364ceee wrote them: a dict per link."""
    from emulator.results.tables import link_endpoints, sim_time_ns

    ends, sim_ns, rows = link_endpoints(topo), sim_time_ns(result), []
    for link, name in enumerate(topo.link_name):
        nbytes, busy, messages, max_wait = result.links.get(link, (0, 0, 0, 0))
        direction, src, dst = ends[link]
        rows.append({
            "link": link, "name": name, "tier": topo.tier_names[topo.link_tier[link]], "direction": direction,
            "node": topo.link_node[link], "src": src, "dst": dst, "bandwidth_GBps": round(topo.link_bw[link], 6),
            "bytes": nbytes, "messages": messages, "busy_ns": busy,
            "utilisation": round(busy / sim_ns, 6) if sim_ns else 0.0, "peak_queue_ns": max_wait,
        })  # fmt: skip
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_links_by_columns_are_the_reference_rows_and_bytes(dp_dir, tmp_path, seed):
    """links.csv written from the columns (and the rows built from them when read) is what the
    dict per link through the csv module gives: busy times past 2**53, a name to quote, no time."""
    from emulator.engine.result import RankResult
    from emulator.results.tables import LINK_COLUMNS

    rng = random.Random(seed)
    config = load_run(dp_dir / "config.yaml")
    topo = Topology(config.cluster)
    result = _fuzzed(rng, topo)
    sim_ns = rng.choice([0, 1, 999_983, 10**11 + 7, 2**53 + 1])
    result.ranks = [RankResult(0, 0, sim_ns, 0, 0, 0, 0, [], {})]
    links = rng.sample(range(len(topo.link_name)), rng.randrange(0, len(topo.link_name)))
    result.links = {link: (rng.randrange(2**40), rng.choice([rng.randrange(max(sim_ns, 1) + 1), 2**53 + 3, 0]),
                           rng.randrange(100), rng.randrange(10**6)) for link in sorted(links)}  # fmt: skip
    if seed % 3 == 2:
        topo.link_name[0] = 'nic,"0"'  # the csv module quotes it: not written from the columns
    rows = reference_link_rows(result, topo)
    f = io.StringIO(newline="")
    writer = csv.DictWriter(f, fieldnames=LINK_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    out, data = write_results(tmp_path / "run", config, {}, result, topo)
    assert (out / "links.csv").read_bytes() == f.getvalue().encode()
    assert repr(data.links) == repr(rows)  # the same values and types, keys in order
