"""The traced ranks' timelines in the Chrome Trace Event format (Perfetto, chrome://tracing).

    emulator run configs/examples/data-parallel.yaml --trace-ranks 0-7,8 --out runs/dp
    # then open runs/dp/trace.json in https://ui.perfetto.dev

A process per node (``pid`` = node), a thread per GPU stream (``gpu R <stream>``), an ``X``
(complete) event per operation, an ``i`` (instant) event per zero-length operation (alloc, free,
mark_iteration), ``wait`` slices for the gaps on each compute stream, and a ``network`` process
with one counter track of utilisation per tier.
"""

from __future__ import annotations

from emulator.engine.ops import KIND_NAMES
from emulator.engine.result import RunResult
from emulator.workloads.streams import is_bubble_stream

NS_PER_US = 1000.0


def _us(ns: int) -> float:
    return ns / NS_PER_US


def wait_slices(ops: list[tuple]) -> list[tuple[str, int, int]]:
    """Gaps on a compute stream: ``(name, start_ns, end_ns)``.

    A gap ends when the next operation's dependencies are met; it is named after the stream whose
    operation finished at that instant (``wait comm``, ``bubble pp``), or plain ``wait`` when no
    traced operation did (the host program itself was blocked).
    """
    compute = sorted((op for op in ops if op[0] == "compute"), key=lambda op: (op[3], op[4]))
    ended_at: dict[int, str] = {}
    for stream, _, _, _, end in ops:
        if stream != "compute":
            ended_at.setdefault(end, stream)
    out = []
    t = 0
    for _, _, _, start, end in compute:
        if start > t:
            other = ended_at.get(start)
            name = "wait" if other is None else f"{'bubble' if is_bubble_stream(other) else 'wait'} {other}"
            out.append((name, t, start))
        t = max(t, end)
    return out


def trace_events(result: RunResult, topo, timeline: list[dict] | None = None) -> list[dict]:
    """Trace events of every traced rank (sorted by rank), plus tier utilisation counters."""
    events: list[dict] = []
    next_tid: dict[int, int] = {}  # per node: tids numbered in rank order, so a GPU's tracks stay together
    for rank in sorted(result.traces):
        ops = result.traces[rank]
        node = topo.rank_node[rank]
        if node not in next_tid:
            next_tid[node] = 0
            events.append({"ph": "M", "name": "process_name", "pid": node, "args": {"name": f"node {node}"}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": node, "args": {"sort_index": node}})
        # compute first, then the other streams by name: the same track order on every rank
        streams = sorted({op[0] for op in ops}, key=lambda s: (s != "compute", s))
        tids = {s: next_tid[node] + i for i, s in enumerate(streams)}
        next_tid[node] += len(streams)
        for stream, tid in tids.items():
            events.append({"ph": "M", "name": "thread_name", "pid": node, "tid": tid,
                           "args": {"name": f"gpu {rank} {stream}"}})  # fmt: skip
            events.append(
                {"ph": "M", "name": "thread_sort_index", "pid": node, "tid": tid, "args": {"sort_index": tid}}
            )
        for stream, name, kind, start, end in ops:
            event = {"name": name, "cat": KIND_NAMES[kind], "pid": node, "tid": tids[stream], "ts": _us(start)}
            if end > start:
                event.update(ph="X", dur=_us(end - start))
            else:
                event.update(ph="i", s="t")
            events.append(event)
        if "compute" in tids:
            for name, start, end in wait_slices(ops):
                events.append({"ph": "X", "name": name, "cat": "wait", "pid": node, "tid": tids["compute"],
                               "ts": _us(start), "dur": _us(end - start)})  # fmt: skip
    if timeline:
        pid = topo.num_nodes  # after the nodes
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": "network"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
        events.extend(_counter_events(timeline, pid))
    return events


def _counter_events(timeline: list[dict], pid: int) -> list[dict]:
    """One counter per tier: utilisation at each bucket start, back to 0 after a bucket without traffic."""
    out = []
    by_tier: dict[str, list[dict]] = {}
    for row in timeline:
        by_tier.setdefault(row["tier"], []).append(row)
    for tier, rows in by_tier.items():
        name = f"utilisation {tier}"
        for i, row in enumerate(rows):
            out.append({"ph": "C", "name": name, "pid": pid, "ts": row["start_s"] * 1e6,
                        "args": {"utilisation": row["utilisation"]}})  # fmt: skip
            if i + 1 == len(rows) or rows[i + 1]["bucket"] != row["bucket"] + 1:
                out.append({"ph": "C", "name": name, "pid": pid, "ts": row["end_s"] * 1e6, "args": {"utilisation": 0}})
    return out


def trace_document(result: RunResult, topo, timeline: list[dict] | None = None, metadata: dict | None = None) -> dict:
    """The JSON object written to ``trace.json``.

    Timestamps are microseconds with nanosecond decimals (the format's unit). No ``displayTimeUnit``:
    some Perfetto versions read it as the unit of ``ts`` rather than a display preference.
    """
    return {
        "traceEvents": trace_events(result, topo, timeline),
        "otherData": {"traced_ranks": sorted(result.traces), **(metadata or {})},
    }
