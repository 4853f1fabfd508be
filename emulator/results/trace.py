"""The traced ranks' timelines in the Chrome Trace Event format (Perfetto, chrome://tracing).

    emulator run configs/examples/data-parallel.yaml --trace-ranks 0-7,8 --out runs/dp
    # then open runs/dp/trace.json in https://ui.perfetto.dev

A process per node (``pid`` = node), a thread per GPU stream (``gpu R <stream>``), an ``X``
(complete) event per operation, an ``i`` (instant) event per zero-length operation (alloc, free,
mark_iteration), ``wait`` slices for the gaps on each compute stream, and a ``network`` process
with one counter track of utilisation per tier.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from itertools import islice
from json.encoder import encode_basestring_ascii as _quote
from pathlib import Path

from emulator.engine.ops import KIND_NAMES
from emulator.engine.result import RunResult
from emulator.workloads.streams import is_bubble_stream

NS_PER_US = 1000.0
INF = math.inf


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
    """Trace events of every traced rank (sorted by rank), plus tier utilisation counters (the
    parsed form of :func:`trace_event_texts`)."""
    return [json.loads(text) for text in trace_event_texts(result, topo, timeline)]


def trace_event_texts(result: RunResult, topo, timeline: list[dict] | None = None) -> Iterator[str]:
    """Each trace event as its compact JSON text, in document order: what :func:`write_trace` streams.

    The per-operation events (about a million for 8 traced GPUs of the reference run) are written
    with f-strings: a dict per event passed through ``json.dumps`` took most of the run directory's
    write time. Keys and values are those ``json.dumps(event, separators=(",", ":"))`` writes for
    the event dict (floats by ``repr``, strings escaped by the json module's own encoder): the text
    is the same byte for byte (tests/emulator/results/test_trace.py)."""
    next_tid: dict[int, int] = {}  # per node: tids numbered in rank order, so a GPU's tracks stay together
    cats = [_quote(name) for name in KIND_NAMES]
    for rank in sorted(result.traces):
        ops = result.traces[rank]
        node = topo.rank_node[rank]
        if node not in next_tid:
            next_tid[node] = 0
            yield _compact({"ph": "M", "name": "process_name", "pid": node, "args": {"name": f"node {node}"}})
            yield _compact({"ph": "M", "name": "process_sort_index", "pid": node, "args": {"sort_index": node}})
        # compute first, then the other streams by name: the same track order on every rank
        streams = sorted({op[0] for op in ops}, key=lambda s: (s != "compute", s))
        tids = {s: next_tid[node] + i for i, s in enumerate(streams)}
        next_tid[node] += len(streams)
        for stream, tid in tids.items():
            yield _compact({"ph": "M", "name": "thread_name", "pid": node, "tid": tid,
                            "args": {"name": f"gpu {rank} {stream}"}})  # fmt: skip
            yield _compact({"ph": "M", "name": "thread_sort_index", "pid": node, "tid": tid,
                            "args": {"sort_index": tid}})  # fmt: skip
        heads = {s: f'"pid":{node},"tid":{tid},"ts":' for s, tid in tids.items()}
        for stream, name, kind, start, end in ops:
            head = f'{{"name":{_quote(name)},"cat":{cats[kind]},{heads[stream]}{start / NS_PER_US!r}'
            if end > start:
                yield f'{head},"ph":"X","dur":{(end - start) / NS_PER_US!r}}}'
            else:
                yield f'{head},"ph":"i","s":"t"}}'
        if "compute" in tids:
            where = f'"cat":"wait","pid":{node},"tid":{tids["compute"]},"ts":'
            for name, start, end in wait_slices(ops):
                dur = (end - start) / NS_PER_US
                yield f'{{"ph":"X","name":{_quote(name)},{where}{start / NS_PER_US!r},"dur":{dur!r}}}'
    if timeline:
        pid = topo.num_nodes  # after the nodes
        yield _compact({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": "network"}})
        yield _compact({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
        yield from _counter_texts(timeline, pid)


def _counter_texts(timeline: list[dict], pid: int) -> Iterator[str]:
    """One counter per tier: utilisation at each bucket start, back to 0 after a bucket without traffic."""
    by_tier: dict[str, list[dict]] = {}
    for row in timeline:
        by_tier.setdefault(row["tier"], []).append(row)
    for tier, rows in by_tier.items():
        head = f'{{"ph":"C","name":{_quote(f"utilisation {tier}")},"pid":{pid},"ts":'
        last = len(rows) - 1
        for i, row in enumerate(rows):
            ts, value = row["start_s"] * 1e6, row["utilisation"]
            if type(value) is float and -INF < value < INF and -INF < ts < INF:  # always, from timeline_rows
                yield f'{head}{ts!r},"args":{{"utilisation":{value!r}}}}}'
            else:
                yield f'{head}{_number(ts)},"args":{{"utilisation":{_number(value)}}}}}'
            if i == last or rows[i + 1]["bucket"] != row["bucket"] + 1:
                yield f'{head}{_number(row["end_s"] * 1e6)},"args":{{"utilisation":0}}}}'


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def _number(value) -> str:
    """A number as json writes it: ints in full, finite floats by repr (json's own rule)."""
    if type(value) is float and -math.inf < value < math.inf or type(value) is int:
        return repr(value)
    return _compact(value)


def trace_document(result: RunResult, topo, timeline: list[dict] | None = None, metadata: dict | None = None) -> dict:
    """The JSON object written to ``trace.json`` (:func:`write_trace`), parsed.

    Timestamps are microseconds with nanosecond decimals (the format's unit). No ``displayTimeUnit``:
    some Perfetto versions read it as the unit of ``ts`` rather than a display preference.
    """
    return {
        "traceEvents": trace_events(result, topo, timeline),
        "otherData": {"traced_ranks": sorted(result.traces), **(metadata or {})},
    }


def write_trace(path: Path, result: RunResult, topo, timeline: list[dict] | None = None,
                metadata: dict | None = None) -> None:  # fmt: skip
    """Write ``trace.json``: :func:`trace_document` as compact JSON, streamed event by event (the
    reference run's is about 50 MB: no document of a million dicts is built)."""
    other = {"traced_ranks": sorted(result.traces), **(metadata or {})}
    texts = trace_event_texts(result, topo, timeline)
    with path.open("w") as f:
        f.write('{"traceEvents":[')
        # joined in batches (the join iterates in C): a few MB of text at a time, never the document
        batch = ",".join(islice(texts, 65536))
        while batch:
            f.write(batch)
            batch = ",".join(islice(texts, 65536))
            if batch:
                f.write(",")
        f.write(f'],"otherData":{_compact(other)}}}\n')
