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
import os
from collections.abc import Iterator
from itertools import chain
from json.encoder import encode_basestring_ascii as _quote
from operator import add, itemgetter, ne
from pathlib import Path

import numpy as np

from emulator.engine.ops import KIND_NAMES
from emulator.engine.result import RunResult
from emulator.results.textrows import INT, TEXT, RowText, TextBlob, decimal_ok
from emulator.workloads.streams import is_bubble_stream

NS_PER_US = 1000.0


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


def trace_events(result: RunResult, topo, timeline=None) -> list[dict]:
    """Trace events of every traced rank (sorted by rank), plus tier utilisation counters (the
    parsed form of :func:`trace_event_texts`)."""
    return [json.loads(text) for text in trace_event_texts(result, topo, timeline)]


def trace_event_texts(result: RunResult, topo, timeline=None) -> Iterator[str]:
    """Each trace event as its compact JSON text, in document order: what :func:`write_trace` streams.

    Keys and values are those ``json.dumps(event, separators=(",", ":"))`` writes for the event dict
    (floats by ``repr``, strings escaped by the json module's own encoder): the text is the same byte
    for byte (tests/emulator/results/test_trace.py). ``timeline``: the timeline table's rows (dicts)
    or :class:`emulator.results.tables.TimelineColumns`."""
    return chain.from_iterable(_trace_chunks(result, topo, timeline))


def _trace_chunks(result: RunResult, topo, timeline, joined: bool = False) -> Iterator[list[str]]:
    """The event texts of :func:`trace_event_texts` in lists (a rank's operations, a tier's counters):
    :func:`write_trace` joins each list in one call instead of resuming a generator per event
    (``joined``: the counters may come as one uint8 array, their ASCII bytes joined by commas).

    The per-operation texts are built from cached parts, because the texts repeat: the traced ranks
    repeat few names (each layer's kernels carry the same name in every microbatch and on every
    rank of a folded group), so ``{"name":...,"cat":...,`` is formatted once per (name, kind) and
    ``"pid":...,"tid":...,"ts":`` once per stream of a rank; and the peers of a folded tensor group
    (emulator/engine/folding.py) have the representative's streams and times exactly, so the part
    from ``"ts"`` on (two float reprs, the costly part) and the wait slices are reused when a rank's
    streams, starts and ends equal the previous rank's (compared as whole lists, in C)."""
    next_tid: dict[int, int] = {}  # per node: tids numbered in rank order, so a GPU's tracks stay together
    cats = [_quote(name) for name in KIND_NAMES]
    last = None  # (streams, starts, ends) of the previous rank, its tails and its wait slices' texts
    name_cat = _NameCat(cats)  # shared by the ranks: the peers of a folded group repeat most names
    name_index = _NameIndex(cats)  # the same texts by number, for the compiled formatter (joined)
    numbered = None  # the previous rank's operations and their names' numbers in name_index (joined)
    for rank in sorted(result.traces):
        ops = result.traces[rank]
        node = topo.rank_node[rank]
        meta = []
        if node not in next_tid:
            next_tid[node] = 0
            meta.append(_compact({"ph": "M", "name": "process_name", "pid": node, "args": {"name": f"node {node}"}}))
            meta.append(_compact({"ph": "M", "name": "process_sort_index", "pid": node,
                                  "args": {"sort_index": node}}))  # fmt: skip
        # compute first, then the other streams by name: the same track order on every rank
        stream_col = list(map(itemgetter(0), ops))
        streams = sorted(set(stream_col), key=lambda s: (s != "compute", s))
        tids = {s: next_tid[node] + i for i, s in enumerate(streams)}
        next_tid[node] += len(streams)
        for stream, tid in tids.items():
            meta.append(_compact({"ph": "M", "name": "thread_name", "pid": node, "tid": tid,
                                  "args": {"name": f"gpu {rank} {stream}"}}))  # fmt: skip
            meta.append(_compact({"ph": "M", "name": "thread_sort_index", "pid": node, "tid": tid,
                                  "args": {"sort_index": tid}}))  # fmt: skip
        yield meta
        heads = {s: f'"pid":{node},"tid":{tid},"ts":' for s, tid in tids.items()}
        timing = (stream_col, list(map(itemgetter(3), ops)), list(map(itemgetter(4), ops)))
        if last is not None and last[0] == timing:
            tails, waits, layout = last[1], last[2], last[3]
        else:
            tails = waits = layout = None
        fast = _op_rows(ops, timing, heads, name_index, layout, numbered) if joined else None
        if fast is not None:
            fast, layout, numbered = fast
            yield fast
        else:
            if tails is None:
                tails = [f'{start / NS_PER_US!r},"ph":"X","dur":{(end - start) / NS_PER_US!r}}}' if end > start
                         else f'{start / NS_PER_US!r},"ph":"i","s":"t"}}'
                         for start, end in zip(timing[1], timing[2], strict=True)]  # fmt: skip
            # '{"name":...,"cat":...,' + '"pid":...,"tid":...,"ts":' + the tail, concatenated in C
            named = map(name_cat.__getitem__, map(itemgetter(1, 2), ops))
            yield list(map(add, map(add, named, map(heads.__getitem__, stream_col)), tails))
        if "compute" in tids:
            if waits is None:
                waits = [(f'{{"ph":"X","name":{_quote(name)},"cat":"wait",',
                          f'{start / NS_PER_US!r},"dur":{(end - start) / NS_PER_US!r}}}')
                         for name, start, end in wait_slices(ops)]  # fmt: skip
            where = f'"pid":{node},"tid":{tids["compute"]},"ts":'
            yield [f"{pre}{where}{post}" for pre, post in waits]
        last = (timing, tails, waits, layout)
    if timeline:
        pid = topo.num_nodes  # after the nodes
        yield [_compact({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": "network"}}),
               _compact({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})]
        yield from _counter_chunks(timeline, pid, joined)


class _NameCat(dict):
    """(name, kind) -> ``{"name":...,"cat":...,``, formatted on first use."""

    def __init__(self, cats: list[str]):
        super().__init__()
        self.cats = cats

    def __missing__(self, key: tuple) -> str:
        name, kind = key
        text = self[key] = f'{{"name":{_quote(name)},"cat":{self.cats[kind]},'
        return text


class _NameIndex(dict):
    """(name, kind) -> the number of its ``{"name":...,"cat":...,`` in ``texts`` (encoded once, for
    every rank's rows), added on first use."""

    def __init__(self, cats: list[str]):
        super().__init__()
        self.cats = cats
        self.texts = TextBlob()

    def __missing__(self, key: tuple) -> int:
        name, kind = key
        index = self[key] = self.texts.append(f'{{"name":{_quote(name)},"cat":{self.cats[kind]},')
        return index


_PH_X, _PH_I = ',"ph":"X","dur":', ',"ph":"i","s":"t"'
_OP_ROWS = RowText(["", "", "", "", "", "}"], ",")  # name and cat, pid tid, ts, ph (and "dur"), dur


def _op_rows(ops: list[tuple], timing: tuple[list, list, list], heads: dict[str, str], names: _NameIndex,
             layout: tuple | None = None,
             named: tuple[list, np.ndarray] | None = None) -> tuple[np.ndarray, tuple, tuple] | None:  # fmt: skip
    """A rank's operation events, joined by commas (ASCII bytes in a uint8 array), as the texts of
    :func:`_trace_chunks`: ``ts`` and ``dur`` are ``ns / 1000.0``, the double nearest to the decimal
    (written from the integer where :func:`emulator.results.textrows.decimal_ok`, else by ``repr``);
    None where a start or end is not an int in 0..2**62. Also returns the rows' layout (every cell
    but the names, and the texts of the cells written by ``repr``), which the next rank reuses as
    ``layout`` when its streams, starts and ends are this rank's (a folded group's peers): only
    its names and its heads' texts differ. The texts: the heads, the two phases' texts, the empty
    text, the cells' texts, then the names. Also returns the rank's operations and their names'
    numbers in ``names``, which the next rank reuses as ``named``: only its operations that differ
    from this rank's (a folded peer's sends and receives, which name their peer) are looked up."""
    from emulator.results.tables import int_array

    if layout is None:
        starts, ends = int_array(timing[1]), int_array(timing[2])
        if starts is None or ends is None or (len(starts) and (min(starts.min(), ends.min()) < 0
                                                               or max(starts.max(), ends.max()) >= 2**62)):  # fmt: skip
            return None
        n = len(ops)
        table = np.empty((n, 5), dtype=np.int64)
        kinds = np.full((n, 5), TEXT, dtype=np.int8)
        head_at = {stream: i for i, stream in enumerate(heads)}
        ph_x = len(heads)
        cells: list[str] = []
        first = ph_x + 3  # the cells' texts follow the heads, the phases and the empty text
        table[:, 1] = np.fromiter(map(head_at.__getitem__, timing[0]), dtype=np.int64, count=n)
        span = ends > starts
        table[:, 3] = np.where(span, ph_x, ph_x + 1)
        table[:, 4] = np.where(span, ends - starts, ph_x + 2)  # an instant: no "dur" (the empty text)
        for column, values, x in ((2, timing[1], starts), (4, None, ends - starts)):
            ok = decimal_ok(x, 3) if values is not None else span & decimal_ok(x, 3)
            table[ok, column] = x[ok]
            kinds[ok, column] = 3
            bad = np.flatnonzero(~ok & (span if values is None else True))
            if len(bad):  # repr of the Python division, as the texts of the plain path
                table[bad, column] = np.arange(first + len(cells), first + len(cells) + len(bad))
                if values is not None:
                    cells.extend(repr(values[i] / NS_PER_US) for i in bad.tolist())
                else:
                    cells.extend(repr((timing[2][i] - timing[1][i]) / NS_PER_US) for i in bad.tolist())
        layout = (table, kinds, cells)
    table, kinds, cells = layout  # the previous rank's: only the names are written over
    prefix = [*heads.values(), _PH_X, _PH_I, "", *cells]
    table[:, 0] = number = _name_numbers(ops, names, named)
    table[:, 0] += len(prefix)
    return _OP_ROWS.format_encoded(table, kinds, *names.texts.with_prefix(prefix)), layout, (ops, number)


def _name_numbers(ops: list[tuple], names: _NameIndex, named: tuple[list, np.ndarray] | None) -> np.ndarray:
    """The number in ``names`` of each operation's (name, kind); ``named``: another rank's
    operations and their numbers, reused where an operation equals that rank's (compared in C: a
    folded tensor group's peers differ in about 5% of their operations, the reference run's in
    1,027 of 22,536), where fewer than half differ."""
    n = len(ops)
    if named is not None and len(named[0]) == n:
        differ = np.flatnonzero(np.fromiter(map(ne, ops, named[0]), dtype=bool, count=n))
        if 2 * len(differ) < n:
            number = named[1].copy()
            number[differ] = [names[op[1], op[2]] for op in map(ops.__getitem__, differ.tolist())]
            return number
    return np.fromiter(map(names.__getitem__, map(itemgetter(1, 2), ops)), dtype=np.int64, count=n)


def _counter_chunks(timeline, pid: int, joined: bool = False) -> Iterator[list[str]]:
    """One counter per tier: utilisation at each bucket start, back to 0 after a bucket without
    traffic. ``timeline``: rows (dicts) or TimelineColumns; each timestamp and value is formatted
    once (the end of a bucket is the start of the next, and the CSV shares the utilisation texts).
    ``joined``: every counter event in one uint8 array of ASCII bytes, joined by commas, where
    :func:`_counter_arrays` can."""
    from emulator.results.tables import TimelineColumns, pick

    cols = timeline if isinstance(timeline, TimelineColumns) else TimelineColumns.from_rows(timeline)
    fast = _counter_arrays(cols, pid) if joined else None
    if fast is not None:
        yield from fast  # each tier's events as ASCII bytes, joined by commas: written as they are
        return
    start_us, end_us = cols.second_texts(_number, scale=1e6)
    value_text = cols.utilisation_texts(_number)
    for tier, index in cols.tier_runs():
        head = f'{{"ph":"C","name":{_quote(f"utilisation {tier}")},"pid":{pid},"ts":'
        texts = [f'{head}{ts},"args":{{"utilisation":{v}}}}}'
                 for ts, v in zip(pick(start_us, index), pick(value_text, index), strict=True)]  # fmt: skip
        # a bucket not followed by the next one: the counter drops to 0 at its end
        buckets, ends = pick(cols.bucket, index), pick(end_us, index)
        gaps = [i for i, (b, nxt) in enumerate(zip(buckets, buckets[1:], strict=False)) if nxt != b + 1]
        gaps.append(len(texts) - 1)
        out, done = [], 0
        for i in gaps:
            out += texts[done:i + 1]
            out.append(f'{head}{ends[i]},"args":{{"utilisation":0}}}}')
            done = i + 1
        yield out


def _counter_arrays(cols, pid: int) -> list[np.ndarray] | None:
    """The events of :func:`_counter_chunks` per tier, joined by commas (ASCII bytes in a uint8
    array), formatted by one compiled loop (emulator/results/textrows.py); None where a column is
    not all ints or all floats."""
    from emulator.results.tables import decimal_cells

    buckets, starts, ends, values = map(cols.array, ("bucket", "start_s", "end_s", "utilisation"))
    if buckets is None or buckets.dtype != np.int64 or any(c is None or c.dtype != np.float64
                                                          for c in (starts, ends, values)):  # fmt: skip
        return None
    out = []
    for tier, index in cols.tier_runs():
        rows = np.arange(len(buckets))[index] if isinstance(index, slice) else np.array(index, dtype=np.int64)
        b = buckets[rows]
        # a bucket not followed by the next one: the counter drops to 0 at its end, in a row of its own
        gaps = np.append(np.flatnonzero(b[1:] != b[:-1] + 1), len(rows) - 1)
        at = np.arange(len(rows)) + np.searchsorted(gaps, np.arange(len(rows)), side="left")
        zero = gaps + np.arange(1, len(gaps) + 1)  # row g's drop follows it
        table = np.zeros((len(rows) + len(gaps), 3), dtype=np.int64)
        kinds = np.full(table.shape, TEXT, dtype=np.int8)
        texts = [f'{{"ph":"C","name":{_quote(f"utilisation {tier}")},"pid":{pid},"ts":']  # the row's head: text 0
        cells, cell_kinds = np.empty(len(rows), dtype=np.int64), np.empty(len(rows), dtype=np.int8)
        # the products start_s * 1e6 in IEEE arithmetic, as Python's float * float
        decimal_cells(starts[rows] * 1e6, 3, cells, cell_kinds, texts, _number)
        table[at, 1], kinds[at, 1] = cells, cell_kinds
        decimal_cells(values[rows], 6, cells, cell_kinds, texts, _number)
        table[at, 2], kinds[at, 2] = cells, cell_kinds
        cells, cell_kinds = cells[:len(gaps)], cell_kinds[:len(gaps)]
        decimal_cells(ends[rows[gaps]] * 1e6, 3, cells, cell_kinds, texts, _number)
        table[zero, 1], kinds[zero, 1] = cells, cell_kinds
        table[zero, 2], kinds[zero, 2] = 0, INT
        out.append(_COUNTER_ROWS.format_array(table, kinds, texts))
    return out


_COUNTER_ROWS = RowText(["", "", ',"args":{"utilisation":', "}}"], ",")


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def _number(value) -> str:
    """A number as json writes it: ints in full, finite floats by repr (json's own rule)."""
    if type(value) is float and -math.inf < value < math.inf or type(value) is int:
        return repr(value)
    return _compact(value)


def trace_document(result: RunResult, topo, timeline=None, metadata: dict | None = None) -> dict:
    """The JSON object written to ``trace.json`` (:func:`write_trace`), parsed.

    Timestamps are microseconds with nanosecond decimals (the format's unit). No ``displayTimeUnit``:
    some Perfetto versions read it as the unit of ``ts`` rather than a display preference.
    """
    return {
        "traceEvents": trace_events(result, topo, timeline),
        "otherData": {"traced_ranks": sorted(result.traces), **(metadata or {})},
    }


def write_trace(path: Path, result: RunResult, topo, timeline=None,
                metadata: dict | None = None) -> None:  # fmt: skip
    """Write ``trace.json``: :func:`trace_document` as compact JSON, streamed event by event (the
    reference run's is about 50 MB: no document of a million dicts is built)."""
    other = {"traced_ranks": sorted(result.traces), **(metadata or {})}
    # every text is ASCII (json's escapes, numbers, the fixed keys): written as bytes, the counters
    # straight from the compiled formatter's buffer; the last newline as text mode writes it
    with path.open("wb") as f:
        f.write(b'{"traceEvents":[')
        sep = b""
        for chunk in _trace_chunks(result, topo, timeline, joined=True):
            if len(chunk):  # each list joined in one call (in C): a rank's or a tier's events, a few MB at most
                f.write(sep)
                f.write(chunk if isinstance(chunk, np.ndarray) else ",".join(chunk).encode("ascii"))
                sep = b","
        f.write(f'],"otherData":{_compact(other)}}}{os.linesep}'.encode("ascii"))
