"""The tables of a run (links, ranks, message sizes, traffic over time) derived from its raw results.

    from emulator.results.tables import link_rows
    rows = link_rows(result, topo)      # result, topo from emulator.runner.sequence.execute(config)

Every table is a list of flat dicts (one per CSV row), so it needs no pandas; the
column meanings are documented in the README (Results).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from itertools import chain, repeat

import numpy as np

from emulator.engine.result import RunResult
from emulator.errors import ConfigError
from emulator.results.summary import histogram_label
from emulator.results.textrows import TEXT, RowText, decimal_ok
from emulator.workloads.streams import is_bubble_stream, stream_dimension

LINK_COLUMNS = ("link", "name", "tier", "direction", "node", "src", "dst", "bandwidth_GBps", "bytes", "messages",
                "busy_ns", "utilisation", "peak_queue_ns")  # fmt: skip
RANK_COLUMNS = ("rank", "node", "gpu", "stage", "final_time_ns", "ops", "flops", "compute_ns", "compute_slowdown",
                "comm_ns", "exposed_comm_ns", "exposed_tp_ns", "exposed_dp_ns", "overlapped_comm_ns", "bubble_ns",
                "idle_ns", "peak_memory_bytes", "iterations")  # fmt: skip
HISTOGRAM_COLUMNS = ("by", "key", "bucket", "max_bytes", "label", "messages")
TIMELINE_COLUMNS = ("tier", "bucket", "start_s", "end_s", "message_bytes", "link_bytes", "utilisation")


def parse_rank_spec(spec: str | Iterable[int] | None, topo) -> list[int]:
    """Ranks to trace: ``None``/``"default"`` (the first node), ``"all"``, ``"none"`` or ``"0-7,64"``."""
    world = topo.world_size
    if spec is None or spec == "default":
        return list(range(topo.node_first_rank[0], topo.node_first_rank[0] + topo.node_gpus[0]))
    if not isinstance(spec, str):
        ranks = sorted({int(r) for r in spec})
    elif spec.strip() in ("all", "none", ""):
        return list(range(world)) if spec.strip() == "all" else []
    else:
        ranks = set()
        for part in spec.split(","):
            lo, _, hi = part.strip().partition("-")
            try:
                ranks.update(range(int(lo), int(hi or lo) + 1))
            except ValueError:
                raise ConfigError(f"--trace-ranks {spec!r}: expected all, none or ranks like 0-7,64") from None
        ranks = sorted(ranks)
    bad = [r for r in ranks if not 0 <= r < world]
    if bad:
        raise ConfigError(f"--trace-ranks: rank {bad[0]} is not in 0..{world - 1}")
    return ranks


def link_endpoints(topo) -> dict[int, tuple[str, str, str]]:
    """``link -> (direction, src, dst)``; a switch is named ``<tier>#<index of its group of nodes>``."""
    spans = topo.tier_span_nodes
    names = topo.tier_names
    out: dict[int, tuple[str, str, str]] = {}
    for rank, (tx, rx) in enumerate(zip(topo.su_tx, topo.su_rx, strict=True)):
        fabric = f"node{topo.rank_node[rank]}.{names[topo.link_tier[tx]]}"
        out[tx] = ("tx", f"gpu{rank}", fabric)
        out[rx] = ("rx", fabric, f"gpu{rank}")
    for node in range(topo.num_nodes):
        for rail, (tx, rx) in enumerate(zip(topo.nic_tx[node], topo.nic_rx[node], strict=True)):
            # each NIC rail has its own switches below the top tier (rail-optimised fabric)
            first = f"{names[1]}#{node // spans[1]}.rail{rail}" if len(names) > 1 else f"node{node}"
            out[tx] = ("tx", f"node{node}.nic{rail}", first)
            out[rx] = ("rx", first, f"node{node}.nic{rail}")
            for k, (up, down) in enumerate(zip(topo.up[node][rail], topo.down[node][rail], strict=True)):
                lower = f"{names[k + 1]}#{node // spans[k + 1]}.rail{rail}"
                upper = f"{names[k + 2]}#{node // spans[k + 2]}" + (f".rail{rail}" if k + 2 < len(names) - 1 else "")
                out[up] = ("up", lower, upper)
                out[down] = ("down", upper, lower)
    return out


def sim_time_ns(result: RunResult) -> int:
    return max((r.final_time_ns for r in result.ranks), default=0)


def link_rows(result: RunResult, topo, ends: dict | None = None) -> list[dict]:
    """One row per link of the cluster (unused links included, with zeros); ``ends``:
    :func:`link_endpoints`, when the caller has them already."""
    return link_columns(result, topo, ends).rows()


@dataclass
class TableColumns:
    """A table by columns (``columns[j][i]``: row ``i``'s value of ``names[j]``), its row dicts
    built only when read (:meth:`rows`)."""

    names: tuple[str, ...]
    columns: list

    def rows(self) -> list[dict]:
        return list(map(dict, map(partial(zip, self.names), zip(*self.columns, strict=True))))

    def plain(self) -> bool:
        """Whether ``str`` writes every cell as the csv module does: ints, floats and strings
        that need no quoting (:func:`csv_plain`), no bool nor None."""
        texts = []
        for column in self.columns:
            types = set(map(type, column))
            if not types <= {int, float, str}:
                return False
            if str in types:
                texts += column if types == {str} else [v for v in column if type(v) is str]
        # one scan of all the strings (tens of thousands of link names): none empty, none to quote
        return all(texts) and not any(c in "\0".join(texts) for c in ',"\r\n')


def link_columns(result: RunResult, topo, ends: dict | None = None) -> TableColumns:
    """:func:`link_rows` by columns (``LINK_COLUMNS``): the same values, gathered column by column."""
    sim_ns = sim_time_ns(result)
    ends = link_endpoints(topo) if ends is None else ends
    n = len(topo.link_name)
    figures = list(map(result.links.get, range(n), repeat((0, 0, 0, 0))))
    nbytes, busy, messages, max_wait = (list(c) for c in zip(*figures, strict=True)) if n else ([], [], [], [])
    direction, src, dst = (list(c) for c in zip(*map(ends.__getitem__, range(n)), strict=True)) if n else ([], [], [])
    if not sim_ns:
        utilisation = [0.0] * n
    elif sim_ns < _EXACT and max(busy, default=0) < _EXACT:  # exact as floats: numpy's division is Python's
        utilisation = round6(busy, float(sim_ns))
    else:
        utilisation = [round(b / sim_ns, 6) for b in busy]
    return TableColumns(LINK_COLUMNS, [
        list(range(n)), list(topo.link_name[:n]), list(map(topo.tier_names.__getitem__, topo.link_tier[:n])),
        direction, list(topo.link_node[:n]), src, dst, [round(bw, 6) for bw in topo.link_bw[:n]],
        nbytes, messages, busy, utilisation, max_wait,
    ])  # fmt: skip


def pipeline_stage(rank: int, world_size: int, config) -> int:
    """Pipeline stage of a rank in Megatron order (tensor fastest, pipeline outermost); 0 without pipeline."""
    parallel = getattr(config, "parallel", None)
    stages = getattr(parallel, "pipeline", 1) or 1
    if stages <= 1 or world_size % stages:
        return 0
    return rank // (world_size // stages)


def rank_rows(result: RunResult, topo, config=None) -> list[dict]:
    """Per-rank time breakdown; ``compute + exposed_comm + bubble + idle`` is the run's virtual time."""
    sim_ns = sim_time_ns(result)
    rows = []
    kinds: dict[str, tuple[bool, str]] = {}  # per stream name: (bubble, dimension), looked up once
    for r in result.ranks:
        waits = r.wait_ns.get("compute", {})
        bubble = exposed = 0
        by_dim: dict[str, int] = {}
        for stream, ns in waits.items():
            kind = kinds.get(stream)
            if kind is None:
                kind = kinds[stream] = (is_bubble_stream(stream), stream_dimension(stream))
            if kind[0]:
                bubble += ns
            elif stream != "compute":
                exposed += ns
            by_dim[kind[1]] = by_dim.get(kind[1], 0) + ns
        rows.append({
            "rank": r.rank, "node": r.node, "gpu": topo.gpu_type(r.rank),
            "stage": pipeline_stage(r.rank, result.world_size, config), "final_time_ns": r.final_time_ns,
            "ops": r.ops, "flops": r.flops, "compute_ns": r.compute_ns,
            # charged over nominal compute: 1.0 unless a fault (slow GPU, jitter) changed its kernels
            "compute_slowdown": round(r.compute_ns / r.nominal_compute_ns, 6) if r.nominal_compute_ns else 1.0,
            "comm_ns": r.comm_ns,
            "exposed_comm_ns": exposed, "exposed_tp_ns": by_dim.get("tensor", 0),
            "exposed_dp_ns": by_dim.get("data", 0),
            # communication running while the compute stream is busy; streams may overlap each other
            "overlapped_comm_ns": max(0, r.comm_ns - exposed), "bubble_ns": bubble,
            # compute on side streams can overlap the compute stream: never report negative idle time
            "idle_ns": max(0, sim_ns - r.compute_ns - exposed - bubble),
            "peak_memory_bytes": r.peak_memory_bytes, "iterations": len(r.marks_ns),
        })  # fmt: skip
    return rows


def histogram_rows(result: RunResult, topo) -> list[dict]:
    """Message counts per size bucket, per tier (``by=tier``) and per operation kind (``by=kind``)."""
    groups = [("tier", topo.tier_names[t], h) for t, h in enumerate(result.size_hist)]
    groups += [("kind", kind, h) for kind, h in result.kind_hist.items()]
    return [
        {
            "by": by,
            "key": key,
            "bucket": b,
            "max_bytes": (1 << b) if b else 0,
            "label": histogram_label(b),
            "messages": count,
        }
        for by, key, hist in groups
        for b, count in sorted(hist.items())
    ]


def sender_capacity_bytes_per_ns(topo, ends: dict | None = None) -> list[float]:
    """Per link tier, the bandwidth of its sender-side links (``tx`` and ``up``), which every
    message crossing the tier occupies once (the receiver side mirrors it)."""
    ends = link_endpoints(topo) if ends is None else ends
    cap = [0.0] * len(topo.tier_names)
    for link, bw in enumerate(topo.link_bw):
        if ends[link][0] in ("tx", "up"):
            cap[topo.link_tier[link]] += bw
    return cap


def csv_plain(texts) -> bool:
    """Whether the csv module writes each of ``texts`` as it is (no quoting: no delimiter, quote or
    line break, not empty)."""
    return all(text and not any(c in text for c in ',"\r\n') for text in texts)


def rows_plain(rows: list[dict]) -> bool:
    """:meth:`TableColumns.plain` of a table given by rows (dicts): every value an int, a float or a
    string that needs no quoting, no bool nor None."""
    values = list(chain.from_iterable(map(dict.values, rows)))
    types = set(map(type, values))
    if not types <= {int, float, str}:
        return False
    texts = [v for v in values if type(v) is str] if str in types else []
    return all(texts) and not any(c in "\0".join(texts) for c in ',"\r\n')


_OPTIONAL = ("message_bytes", "link_bytes")
# the columns that _timeline_arrays gives as arrays alone: their lists (0.2 million ints and floats
# each in the reference run, about 25 MiB in all) are built only if something reads them
_ARRAY_ONLY = ("bucket", "start_s", "end_s", "message_bytes", "link_bytes")


@dataclass
class TimelineColumns:
    """The timeline table by columns (row ``i`` is ``tier[i], bucket[i], ...``): timeline.csv and the
    trace's utilisation counters are formatted from these lists, and the row dicts built once
    (:meth:`rows`), for the reference run's 200,000 rows.

    ``seconds``: from :func:`timeline_columns`, ``(first, values)`` where ``values[k]`` is the start
    of bucket ``first + k`` in seconds for every bucket from the first to one past the last, so that
    each bucket's time is formatted once although it is a row's start and the previous row's end,
    on every tier."""

    tier: list[str]
    bucket: list[int]
    start_s: list[float]
    end_s: list[float]
    message_bytes: list[int]
    link_bytes: list[int]
    utilisation: list[float]
    seconds: tuple[int, list[float]] | None = None
    _texts: dict = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:  # the number of rows: no rows, no counters in the trace
        if "bucket" not in self.__dict__:
            return len(self._texts[("array", "bucket")])
        return len(self.bucket)

    def __getattr__(self, name: str):
        """A column given only as its array (:func:`_timeline_arrays`: the writers read the arrays),
        as its list, built on first read."""
        arrays = self.__dict__.get("_texts", {})
        if name in _ARRAY_ONLY and ("array", name) in arrays:
            values = arrays[("array", name)].tolist()
            setattr(self, name, values)
            return values
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def from_rows(cls, rows: list[dict]) -> TimelineColumns:
        """Columns of rows (dicts); the byte counts may be missing (the trace does not read them)."""
        return cls(*([row[c] if c not in _OPTIONAL else row.get(c) for row in rows] for c in TIMELINE_COLUMNS))

    def columns(self) -> tuple[list, ...]:
        return tuple(getattr(self, c) for c in TIMELINE_COLUMNS)

    def rows(self) -> list[dict]:
        return [{"tier": t, "bucket": b, "start_s": s, "end_s": e, "message_bytes": m, "link_bytes": lb,
                 "utilisation": u} for t, b, s, e, m, lb, u in zip(*self.columns(), strict=True)]  # fmt: skip

    def tier_runs(self) -> list[tuple[str, slice | list[int]]]:
        """``(tier, rows)`` per tier in order of first appearance; ``rows`` a slice when the tier's rows
        are contiguous (always, from :func:`timeline_columns`), else a list of row numbers."""
        if "tier_runs" in self._texts:
            return self._texts["tier_runs"]
        runs: list[tuple[str, slice]] = []
        i, n = 0, len(self.tier)
        while i < n:  # each tier's rows counted in C: contiguous when all of them follow its first
            tier = self.tier[i]
            count = self.tier.count(tier)
            if not count or self.tier[i:i + count].count(tier) != count:
                break
            runs.append((tier, slice(i, i + count)))
            i += count
        else:
            self._texts["tier_runs"] = runs
            return runs
        order: dict[str, list[int]] = {}
        for i, tier in enumerate(self.tier):
            order.setdefault(tier, []).append(i)
        return list(order.items())

    def utilisation_texts(self, text=str) -> list[str]:
        """Each utilisation as text: ``str`` (the CSV's), or ``text`` (json's, for the trace) where a
        value is not an int or a finite float (for those json writes what ``str`` does)."""
        if text is not str and plain_numbers(self.utilisation):
            text = str  # the same texts: the CSV's are shared
        key = ("utilisation", text)
        if key not in self._texts:
            self._texts[key] = number_texts(self.utilisation, text)
        return self._texts[key]

    def second_texts(self, text=str, scale: float | None = None) -> tuple[list[str], list[str]]:
        """The text (as :meth:`utilisation_texts`) of ``start_s[i] * scale`` and ``end_s[i] * scale``
        per row (``scale`` None: the values themselves); each bucket's formatted once when
        ``seconds`` is known."""
        if text is not str and (self.seconds is not None or plain_numbers(self.start_s + self.end_s)):
            text = str  # bucket times from timeline_columns are finite floats
        key = ("seconds", text, scale)
        if key not in self._texts:
            if self.seconds is None:
                starts, ends = self.start_s, self.end_s
                if scale is not None:
                    starts, ends = [s * scale for s in starts], [e * scale for e in ends]
                self._texts[key] = number_texts(starts, text), number_texts(ends, text)
            else:
                first, values = self.seconds
                if scale is not None:  # the same IEEE products as Python's float * float
                    values = (np.array(values) * scale).tolist()
                texts = number_texts(values, text)
                offset = np.array(self.bucket, dtype=np.int64) - first
                self._texts[key] = (list(map(texts.__getitem__, offset.tolist())),
                                    list(map(texts.__getitem__, (offset + 1).tolist())))  # fmt: skip
        return self._texts[key]

    def csv_lines(self) -> str:
        """The data lines of timeline.csv, as ``csv.writer`` writes them for plain values
        (:func:`csv_plain`): ints by ``str``, floats by ``repr`` (which is their ``str``)."""
        fast = self.csv_bytes()
        if fast is not None:
            return fast.tobytes().decode()
        starts, ends = self.second_texts(str)
        return "".join([f"{t},{b},{s},{e},{m},{lb},{u}\r\n" for t, b, s, e, m, lb, u in zip(
            self.tier, self.bucket, starts, ends, self.message_bytes, self.link_bytes,
            self.utilisation_texts(str), strict=True)])  # fmt: skip


    def array(self, column: str) -> np.ndarray | None:
        """``column`` as a numpy array (int64 for ints, float64 for floats; :func:`int_array`,
        :func:`float_array`), converted once; None where it is neither all ints nor all floats."""
        key = ("array", column)
        if key not in self._texts:
            values = getattr(self, column)
            self._texts[key] = int_array(values) if values and type(values[0]) is int else float_array(values)
        return self._texts[key]

    def csv_bytes(self) -> np.ndarray | None:
        """:meth:`csv_lines` as UTF-8 (a uint8 array), formatted by one compiled loop
        (emulator/results/textrows.py); None where a column holds other than ints in int64's range
        or floats (bool, None, a str)."""
        n = len(self.bucket)
        ints = [self.array(c) for c in ("bucket", "message_bytes", "link_bytes")]
        floats = [self.array(c) for c in ("start_s", "end_s", "utilisation")]
        if any(c is None or c.dtype != np.int64 or len(c) != n for c in ints) or len(self.tier) != n \
                or any(c is None or c.dtype != np.float64 or len(c) != n for c in floats):  # fmt: skip
            return None
        texts: list[str] = []
        values = np.empty((n, 7), dtype=np.int64)
        kinds = np.zeros((n, 7), dtype=np.int8)
        index: dict[str, int] = {}
        for tier, rows in self.tier_runs():
            if not isinstance(tier, str):
                return None
            index[tier] = len(texts)
            texts.append(tier)
            values[rows, 0] = index[tier]
        kinds[:, 0] = TEXT
        values[:, 1], values[:, 4], values[:, 5] = ints
        for column, (x, decimals) in zip((2, 3, 6), zip(floats, (9, 9, 6), strict=True), strict=True):
            decimal_cells(x, decimals, values[:, column], kinds[:, column], texts)
        return _CSV_ROWS.format_array(values, kinds, texts)


def int_array(column: list) -> np.ndarray | None:
    """``column`` as int64 when every value is an int (not a bool) in int64's range, else None."""
    if not set(map(type, column)) <= {int}:
        return None
    try:
        return np.array(column, dtype=np.int64)
    except OverflowError:
        return None


def float_array(column: list) -> np.ndarray | None:
    """``column`` as float64 when every value is a float, else None."""
    return np.array(column, dtype=np.float64) if set(map(type, column)) <= {float} else None


def decimal_cells(x: np.ndarray, decimals: int, values: np.ndarray, kinds: np.ndarray, texts: list[str],
                  text=repr) -> None:  # fmt: skip
    """Fill one column of a :class:`emulator.results.textrows.RowText` table with the floats ``x``:
    a float that is exactly ``k / 10**decimals`` (the nearest double to that decimal: the int64
    division is IEEE's, correctly rounded) with a decimal form ``repr`` writes is the cell ``k``
    of kind ``decimals``; any other (-0.0, inf, nan, tiny, huge, an inexact product such as
    ``start_s * 1e6``) is ``text`` of it (``repr``: the CSV's; json's for the trace), appended to
    ``texts``."""
    scale = 10.0**decimals
    with np.errstate(invalid="ignore", over="ignore"):
        k = np.rint(x * scale)
        finite = np.abs(k) < 2.0**62
        k = np.where(finite, k, 0).astype(np.int64)
    ok = finite & (k / scale == x) & ~np.signbit(x) & decimal_ok(k, decimals)
    values[:] = k
    kinds[:] = decimals
    bad = np.flatnonzero(~ok)
    if len(bad):
        values[bad] = np.arange(len(texts), len(texts) + len(bad))
        kinds[bad] = TEXT
        texts.extend(map(text, x[bad].tolist()))


_CSV_ROWS = RowText(["", ",", ",", ",", ",", ",", ",", "\r\n"])


def plain_numbers(values: list) -> bool:
    """Whether every value is an int or a finite float: ``str`` writes them as json does (``str`` of
    a float is its ``repr``)."""
    types = set(map(type, values))
    if not types <= {int, float}:
        return False
    floats = values if types == {float} else [v for v in values if type(v) is float]
    return not floats or bool(np.isfinite(np.array(floats, dtype=np.float64)).all())


def number_texts(values: list, text=str) -> list[str]:
    """``str`` of each value when :func:`plain_numbers`, else ``text`` of each."""
    return list(map(str if text is str or plain_numbers(values) else text, values))


def pick(column: list, rows: slice | list[int]) -> list:
    """The values of ``column`` at ``rows`` (a slice or row numbers, from :meth:`TimelineColumns.tier_runs`)."""
    return column[rows] if isinstance(rows, slice) else [column[i] for i in rows]


_EXACT = 1 << 53  # ints below convert to float exactly, in Python and in numpy alike


def bucket_seconds(first: int, last: int, bucket_ns: int) -> list[float]:
    """``[slot * bucket_ns / 1e9 for slot in range(first, last + 1)]``, the same floats (the int
    products are exact below 2**53, the conversion and the division are IEEE's), vectorised."""
    if first < 0 or last * bucket_ns >= _EXACT:
        return [slot * bucket_ns / 1e9 for slot in range(first, last + 1)]
    return ((np.arange(first, last + 1, dtype=np.int64) * bucket_ns) / 1e9).tolist()


def round6(values: list[int], divisor: float) -> list[float]:
    """``[round(v / divisor, 6) for v in values]``, the same floats, vectorised.

    Python's ``round(x, 6)`` is the double nearest to ``m / 10**6``, ``m`` the integer nearest to
    the exact ``x * 10**6`` (ties to even). numpy's ``rint(x * 1e6)`` is that ``m`` unless the
    product's rounding error (at most ``y * 2**-53``) reaches a half-integer: those values, and any
    outside the exact range, are rounded by Python's ``round``; ``m / 1e6`` is then the nearest double."""
    if not values:
        return []
    v = np.array(values, dtype=np.float64) if max(values) < _EXACT and min(values) >= 0 else None
    if v is None or not divisor > 0:
        return [round(x / divisor, 6) for x in values]
    x = v / divisor
    y = x * 1e6
    if not np.all(y < _EXACT / 2):
        return [round(x / divisor, 6) for x in values]
    m = np.rint(y)
    near = np.abs(y - np.floor(y) - 0.5) <= y * 2.0**-50
    out = (m / 1e6).tolist()
    for i in np.flatnonzero(near).tolist():
        out[i] = round(values[i] / divisor, 6)
    return out


def timeline_columns(result: RunResult, topo, ends: dict | None = None) -> TimelineColumns:
    """Traffic per tier per time bucket (only buckets with traffic); see the README (Results).

    ``message_bytes``: messages whose highest tier is this one, by the bucket they start in;
    ``link_bytes``: what this tier's links carry (a message crossing the spine also crosses the NICs);
    ``utilisation``: link_bytes / (tier sender-side capacity * bucket). ``ends``: as for :func:`link_rows`.
    """
    tiers = len(topo.tier_names)
    cap = sender_capacity_bytes_per_ns(topo, ends)
    bucket_ns = result.bucket_ns
    out = _timeline_arrays(result, topo, cap)
    if out is not None:
        return out
    out = TimelineColumns([], [], [], [], [], [], [])
    for tier in range(tiers):
        # the scale-up tier carries only its own messages; switch tier k carries those of tiers >= k
        own = result.timeline[tier]
        carried = dict(own)
        for t in range(tier + 1, tiers) if tier else ():
            for slot, nbytes in result.timeline[t].items():
                carried[slot] = carried.get(slot, 0) + nbytes
        slots = sorted(carried)
        link = list(map(carried.__getitem__, slots))
        capacity = cap[tier] * bucket_ns  # bytes the tier's sender side can carry in a bucket
        out.tier += [topo.tier_names[tier]] * len(slots)
        out.bucket += slots
        out.message_bytes += [own.get(slot, 0) for slot in slots]
        out.link_bytes += link
        out.utilisation += round6(link, capacity) if capacity else [0.0] * len(link)
    if out.bucket:
        first, last = min(out.bucket), max(out.bucket) + 1
        if last - first <= 4 * len(out.bucket):  # dense enough: one value per bucket of the run
            values = bucket_seconds(first, last, bucket_ns)
            out.seconds = (first, values)
            out.start_s = list(map(values.__getitem__, [slot - first for slot in out.bucket]))
            out.end_s = list(map(values.__getitem__, [slot + 1 - first for slot in out.bucket]))
        else:
            out.start_s = [slot * bucket_ns / 1e9 for slot in out.bucket]
            out.end_s = [(slot + 1) * bucket_ns / 1e9 for slot in out.bucket]
    return out


_INT64_SAFE = 2.0**62  # a sum of int64 byte counts below this cannot overflow


def _line_arrays(line: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """A tier's ``slot -> bytes`` as int64 arrays sorted by slot; None unless all are ints that fit."""
    if not (set(map(type, line)) | set(map(type, line.values()))) <= {int}:
        return None
    try:
        slots = np.fromiter(line, dtype=np.int64, count=len(line))
        nbytes = np.fromiter(line.values(), dtype=np.int64, count=len(line))
    except OverflowError:
        return None
    order = np.argsort(slots, kind="stable")
    return slots[order], nbytes[order]


def _timeline_arrays(result: RunResult, topo, cap: list[float]) -> TimelineColumns | None:
    """:func:`timeline_columns` by numpy over the slots (sorted, summed per slot over the tiers a
    switch tier carries): the same ints and floats, and the columns' arrays kept for the writers
    (:meth:`TimelineColumns.array`); None where the Python statement must run (a count that is not
    an int, an int or a sum beyond int64, a run whose buckets are too sparse for ``seconds``)."""
    tiers = len(topo.tier_names)
    lines = [_line_arrays(line) for line in result.timeline[:tiers]]
    if len(lines) < tiers or any(line is None for line in lines):
        return None
    if sum(float(np.abs(nbytes).astype(np.float64).sum()) for _, nbytes in lines) >= _INT64_SAFE:
        return None
    bucket_ns = result.bucket_ns
    names, buckets, messages, carried, utilisation = [], [], [], [], []
    for tier in range(tiers):
        own_slots, own_bytes = lines[tier]
        if tier:  # switch tier k carries the messages of tiers >= k: summed per slot
            slots = np.concatenate([lines[t][0] for t in range(tier, tiers)])
            nbytes = np.concatenate([lines[t][1] for t in range(tier, tiers)])
            order = np.argsort(slots, kind="stable")
            slots, nbytes = slots[order], nbytes[order]
            first = np.flatnonzero(np.concatenate(([True], slots[1:] != slots[:-1]))) if len(slots) else slots
            slots, link = slots[first], np.add.reduceat(nbytes, first) if len(first) else nbytes
            at = np.searchsorted(own_slots, slots)
            hit = at < len(own_slots)
            hit[hit] = own_slots[at[hit]] == slots[hit]
            message = np.zeros(len(slots), dtype=np.int64)
            message[hit] = own_bytes[at[hit]]
        else:  # the scale-up tier carries only its own messages
            slots, link, message = own_slots, own_bytes, own_bytes
        capacity = cap[tier] * bucket_ns  # bytes the tier's sender side can carry in a bucket
        link_list = link.tolist()
        names += [topo.tier_names[tier]] * len(slots)
        buckets.append(slots)
        messages.append(message)
        carried.append(link)
        utilisation += round6(link_list, capacity) if capacity else [0.0] * len(link_list)
    bucket = np.concatenate(buckets)
    if not len(bucket):
        return TimelineColumns([], [], [], [], [], [], [])
    first, last = int(bucket.min()), int(bucket.max()) + 1
    if last - first > 4 * len(bucket):
        return None
    values = bucket_seconds(first, last, bucket_ns)
    seconds = np.array(values, dtype=np.float64)
    offset = bucket - first
    start, end = seconds[offset], seconds[offset + 1]
    message, link = np.concatenate(messages), np.concatenate(carried)
    out = TimelineColumns(names, [], [], [], [], [], utilisation, seconds=(first, values))
    for column, array in (("bucket", bucket), ("start_s", start), ("end_s", end), ("message_bytes", message),
                          ("link_bytes", link)):  # fmt: skip
        out._texts[("array", column)] = array
        del out.__dict__[column]  # its list built when read (TimelineColumns.__getattr__)
    return out


def timeline_rows(result: RunResult, topo) -> list[dict]:
    """The timeline table (:func:`timeline_columns`) as one dict per row."""
    return timeline_columns(result, topo).rows()


# The compute stream's waits per rank, by what it waited for: rows of (part, ranks.csv column).
# Pipeline waits (bubble_ns) hold both the schedule's bubble and pipeline transfers that were not
# hidden: the engine records which stream released a wait, not why that stream was late.
COMM_SPLIT = (("tensor parallel (tp)", "exposed_tp_ns"), ("data parallel (dp)", "exposed_dp_ns"),
              ("pipeline parallel (pp.*): bubble and transfers", "bubble_ns"))  # fmt: skip


def comm_split_rows(ranks: list[dict]) -> list[dict]:
    """Mean per rank of the compute stream's waits per parallelism dimension, in ns and as a fraction
    of the rank's run time; ``other`` is exposed communication on any other stream (a user program's).
    A ranks.csv written before ``exposed_tp_ns``/``exposed_dp_ns`` existed has no split: those rows
    are None and the whole exposed communication is one row, marked as not split."""
    if not ranks:
        return []
    n = len(ranks)
    split = all("exposed_tp_ns" in r and "exposed_dp_ns" in r for r in ranks)
    run_ns = sum(r["compute_ns"] + r["exposed_comm_ns"] + r["bubble_ns"] + r["idle_ns"] for r in ranks) / n
    rows = [{"part": part, "column": col, "mean_ns": sum(r[col] for r in ranks) / n if split or col == "bubble_ns"
             else None} for part, col in COMM_SPLIT]  # fmt: skip
    other = sum(r["exposed_comm_ns"] - r.get("exposed_tp_ns", 0) - r.get("exposed_dp_ns", 0) for r in ranks) / n
    part = "other streams" if split else "exposed communication, not split (ranks.csv predates the split)"
    rows.insert(2, {"part": part, "column": None, "mean_ns": other})
    for row in rows:
        row["fraction"] = None if row["mean_ns"] is None else row["mean_ns"] / run_ns if run_ns else 0.0
    return rows


def _capacity_bytes(gpu: str) -> int | None:
    from emulator.hardware.gpus import get_gpu

    try:
        return get_gpu(gpu).hbm_bytes
    except ConfigError:  # a GPU type registered by the program that wrote the run, not known here
        return None


def stage_memory_rows(ranks: list[dict], summary: dict) -> list[dict]:
    """Per pipeline stage: the largest peak over its ranks, the workload's prediction (when the run
    has one, ``emulator check``'s figure) and the HBM capacity of its smallest GPU."""
    stages: dict[int, list[dict]] = {}
    for r in ranks:
        stages.setdefault(int(r["stage"]), []).append(r)
    predicted = summary.get("predicted_peak_memory_bytes_by_stage") or {}
    rows = []
    for stage, members in sorted(stages.items()):
        gpus = sorted({str(r["gpu"]) for r in members})
        capacities = [c for c in map(_capacity_bytes, gpus) if c is not None]
        capacity = min(capacities) if capacities else None
        peak = max(r["peak_memory_bytes"] for r in members)
        rows.append({
            "stage": stage, "gpu": ", ".join(gpus), "ranks": len(members), "peak_memory_bytes": peak,
            "predicted_peak_bytes": predicted.get(str(stage)), "capacity_bytes": capacity,
            "fraction_of_capacity": peak / capacity if capacity else None,
        })  # fmt: skip
    return rows
