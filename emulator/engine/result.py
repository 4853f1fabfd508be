"""Merging what the shards measured into the run's results, and the fingerprint.

The fingerprint is a digest of every result figure the run recorded: per rank its final time,
operations, compute and communication time, FLOPs, peak memory, iteration marks and waits per stream;
per link its bytes, busy time, messages and longest queueing; per tier its bytes and messages, the
message-size histograms (per tier and per operation kind) and the traffic timeline. Two runs have the
same fingerprint exactly when all of those are identical. How the run was emulated (backend, shards,
events, rounds, wall time) and which ranks were traced are not results and are left out.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter


@dataclass
class RankResult:
    rank: int
    node: int
    final_time_ns: int
    ops: int
    compute_ns: int
    comm_ns: int
    peak_memory_bytes: int
    marks_ns: list[int]
    wait_ns: dict[str, dict[str, int]]  # stream -> {stream it waited on: ns}
    flops: float = 0.0  # FLOPs of the compute ops it ran
    # what compute_ns would have been without faults (emulator/engine/faults.py): derived from the config,
    # hence not in the fingerprint; None where unknown (results written before faults existed)
    nominal_compute_ns: int | None = None


@dataclass
class RunResult:
    """Everything a run measured, backend-independent."""

    world_size: int
    ranks: list[RankResult]
    links: dict[int, tuple[int, int, int, int]]  # link -> (bytes, busy_ns, messages, max_wait_ns)
    tier_bytes: list[int]
    tier_messages: list[int]
    size_hist: list[dict[int, int]]
    events: int
    rounds: int
    cross_shard_messages: int
    kind_hist: dict[str, dict[int, int]] = field(default_factory=dict)  # op kind -> size bucket -> count
    timeline: list[dict[int, int]] = field(default_factory=list)  # tier -> time bucket -> bytes
    bucket_ns: int = 1_000_000
    traces: dict[int, list] = field(default_factory=dict)  # rank -> (stream, name, kind, start_ns, end_ns)
    extra: dict = field(default_factory=dict)


def export_shard(shard) -> dict:
    """What one shard sends back at the end: plain data, cheap to pickle."""
    owned_nodes = {gpu.node for gpu in shard.gpus.values()}
    topo = shard.topo
    owned_links = [i for i, node in enumerate(topo.link_node) if node in owned_nodes]
    data = shard.stats.export(owned_links)
    fold = getattr(shard, "fold", 1)
    rows = []
    lost = getattr(shard, "compute_lost_ns", {})  # charged minus nominal compute, by rank (faults)
    for g in (shard.gpus[r] for r in sorted(shard.gpus)):
        row = (g.rank, g.node, g.last_time, g.ops_done, g.compute_ns, g.comm_ns, g.mem_peak, list(g.marks),
               g.wait_ns, g.flops_done, g.compute_ns - lost.get(g.rank, 0))  # fmt: skip
        # under symmetry folding the representative's figures are every folded rank's
        rows.extend((g.rank + j, *row[1:]) for j in range(fold))
    data["ranks"] = rows
    data["traces"] = {}
    for g in shard.gpus.values():
        if g.trace is not None:
            from emulator.engine.folding import replicate_traces

            wanted = getattr(shard, "trace_requested", None)
            offsets = [j for j in range(fold) if wanted is None or g.rank + j in wanted]
            for j, trace in zip(offsets, replicate_traces(g.trace, offsets, fold), strict=True):
                data["traces"][g.rank + j] = trace
    if fold > 1:
        from emulator.engine.folding import replicate_links

        data["links"] = replicate_links(topo, data["links"], sorted(owned_nodes), fold)
    data["events"] = shard.events
    data["busy_s"] = shard.busy_s
    return data


def merge(world_size: int, exports: list[dict], rounds: int, cross_shard_messages: int,
          partial: bool = False) -> RunResult:  # fmt: skip
    """One ``RunResult`` from the shards' exports; ``partial``: a stopped run's, where the ranks of
    a shard that could not answer are missing."""
    ranks = sorted((RankResult(*r) for e in exports for r in e["ranks"]), key=lambda r: r.rank)
    assert len(ranks) == world_size or (partial and len(ranks) < world_size), (len(ranks), world_size)
    links: dict = {}
    for e in exports:
        links.update({int(k): tuple(v) for k, v in e["links"].items()})
    tiers = len(exports[0]["tier_bytes"])
    hist: list[dict[int, int]] = [{} for _ in range(tiers)]
    for e in exports:
        for t, h in enumerate(e["size_hist"]):
            for bucket, count in h.items():
                hist[t][int(bucket)] = hist[t].get(int(bucket), 0) + count
    return RunResult(
        world_size=world_size,
        ranks=ranks,
        links=dict(sorted(links.items())),
        tier_bytes=[sum(e["tier_bytes"][t] for e in exports) for t in range(tiers)],
        tier_messages=[sum(e["tier_messages"][t] for e in exports) for t in range(tiers)],
        size_hist=[dict(sorted(h.items())) for h in hist],
        events=sum(e["events"] for e in exports),
        rounds=rounds,
        cross_shard_messages=cross_shard_messages,
        kind_hist=_merge_counts([e["kind_hist"] for e in exports]),
        timeline=[_merge_counts([e["timeline"][t] for e in exports], nested=False) for t in range(tiers)],
        bucket_ns=exports[0]["bucket_ns"],
        traces={int(r): t for e in exports for r, t in e.get("traces", {}).items()},
        extra={"shard_busy_s": [e.get("busy_s", 0.0) for e in exports]},
    )


def _merge_counts(dicts: list[dict], nested: bool = True) -> dict:
    """Sum counters (``{key: {bucket: n}}`` when nested, ``{bucket: n}`` otherwise), keys sorted."""
    if not nested:
        fast = _sum_int_counts(dicts)
        if fast is not None:
            return fast
        total: dict[int, int] = {}
        for d in dicts:
            for k, v in d.items():
                total[int(k)] = total.get(int(k), 0) + v
        return dict(sorted(total.items()))
    out: dict = {}
    for d in dicts:
        for key, inner in d.items():
            out.setdefault(key, []).append(inner)
    return {k: _merge_counts(v, nested=False) for k, v in sorted(out.items())}


def _sum_int_counts(dicts: list[dict]) -> dict[int, int] | None:
    """:func:`_merge_counts` of flat counters whose keys and counts are all plain ints in int64 (the
    shards' own exports; a Ray export read back from JSON has text keys): the same dict, summed
    and sorted by numpy (the reference run's traffic timeline, 200,000 buckets, took 0.15 s by
    the loop); None for anything else."""
    import numpy as np

    if not all(set(map(type, d)) <= {int} and set(map(type, d.values())) <= {int} for d in dicts):
        return None
    try:
        keys = [np.fromiter(d, dtype=np.int64, count=len(d)) for d in dicts]
        counts = [np.fromiter(d.values(), dtype=np.int64, count=len(d)) for d in dicts]
    except OverflowError:
        return None
    if len(dicts) == 1 and np.all(keys[0][1:] > keys[0][:-1]):
        return dict(dicts[0])  # already in key order
    key, count = np.concatenate(keys), np.concatenate(counts)
    if len(dicts) > 1 and len(count) and np.abs(count).max() >= (1 << 62) // len(count):
        return None  # a sum could leave int64: Python's ints add without bound
    order = np.argsort(key, kind="stable")
    key, count = key[order], count[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.zeros(0, dtype=np.int64)
    return dict(zip(key[first].tolist(), np.add.reduceat(count, first).tolist() if len(key) else [], strict=True))


def _encode(value, out: list[str]) -> None:
    """Append an unambiguous byte encoding of ``value`` (ints, floats, strings, lists, dicts) to ``out``.

    Every value carries a type tag and containers their length, so that no two different structures
    encode alike; ints are written in full (repr), floats as their exact IEEE-754 bits, dicts in key
    order (the shards' merge order must not matter). The bytes are held as text whose code points
    are the bytes (Latin-1): the digest takes ``"".join(out).encode("latin-1")``, and building text
    is several times cheaper in Python than concatenating bytes (the reference run has 3,072 ranks
    and tens of thousands of links). Plain ints - almost every figure - take the inline branches."""
    tp = type(value)
    if tp is int:
        out.append(f"i{value!r};")
    elif tp is bool or value is None:
        out.append(f"b{value!r}")
    elif isinstance(value, int):  # an int subclass: written by its own repr, as a plain int is
        out.append(f"i{value!r};")
    elif isinstance(value, float):
        out.append("f" + struct.pack("<d", value).decode("latin-1"))
    elif isinstance(value, str):
        raw = value if value.isascii() else value.encode().decode("latin-1")
        out.append(f"s{len(raw)}:{raw}")
    elif isinstance(value, (list, tuple)):
        if all(type(item) is int for item in value):  # one fragment for a list of plain ints
            out.append(f"l{len(value)}:" + "".join([f"i{item!r};" for item in value]))
            return
        out.append(f"l{len(value)}:")
        for item in value:
            if type(item) is int:
                out.append(f"i{item!r};")
            else:
                _encode(item, out)
    elif isinstance(value, dict):
        out.append(f"d{len(value)}:")
        key_types = set(map(type, value))
        if len(key_types) == 1 and (int in key_types or str in key_types):
            keys = sorted(value)  # one key type: the (type name, key) order is the keys' own
            if int in key_types and _encode_int_dict(keys, value, out):
                return
        else:
            keys = sorted(value, key=lambda k: (type(k).__name__, k))
        for key in keys:
            item = value[key]
            if type(key) is int:
                head = f"i{key!r};"
            elif type(key) is str and key.isascii():
                head = f"s{len(key)}:{key}"
            else:
                _encode(key, out)
                head = ""
            if type(item) is int:
                out.append(f"{head}i{item!r};")
            else:
                out.append(head)
                _encode(item, out)
    else:
        raise TypeError(f"fingerprint: cannot encode {type(value).__name__}")


def _encode_int_dict(keys: list[int], value: dict, out: list[str]) -> bool:
    """The items of a dict with plain int keys (sorted ``keys``) in one fragment, when its values are
    all plain ints (the traffic timeline: 200,000 buckets in the reference run) or all tuples of
    plain ints of one length (the links' figures): the bytes :func:`_encode` writes item by item,
    formatted by one ``%`` per item. False (nothing appended) for any other values."""
    items = list(map(value.__getitem__, keys))
    kinds = set(map(type, items))
    if kinds == {int}:
        # one ``%`` over the keys and values interleaved (about half the time of a format per
        # item): ``%d`` of a plain int is its repr
        flat: list = [0] * (2 * len(keys))
        flat[::2], flat[1::2] = keys, items
        out.append(("i%d;i%d;" * len(keys)) % tuple(flat))
        return True
    if kinds != {tuple} or len(set(map(len, items))) != 1 or set(map(type, chain.from_iterable(items))) != {int}:
        return False
    n = len(items[0])
    # one ``%`` over each key followed by its values, as above
    flat = [0] * ((n + 1) * len(keys))
    flat[::n + 1] = keys
    for j in range(n):
        flat[j + 1::n + 1] = map(itemgetter(j), items)
    out.append((f"i%d;l{n}:{'i%d;' * n}" * len(keys)) % tuple(flat))
    return True


def _encode_waits(waits, out: list[str]) -> bool:
    """:func:`_encode` of a rank's waits (stream -> {stream it waited on: ns}) when every stream
    name is ASCII text and every figure a plain int, in one fragment (the unfolded straggler run
    has 3,072 ranks of about five streams each); False (nothing appended) for anything else."""
    if type(waits) is not dict or not all(type(k) is str and k.isascii() and type(v) is dict
                                          for k, v in waits.items()):  # fmt: skip
        return False
    text = [f"d{len(waits)}:"]
    for stream in sorted(waits):
        inner = waits[stream]
        if not all(type(k) is str and k.isascii() and type(v) is int for k, v in inner.items()):
            return False
        text.append(f"s{len(stream)}:{stream}d{len(inner)}:")
        text += [f"s{len(k)}:{k}i{inner[k]!r};" for k in sorted(inner)]
    out.append("".join(text))
    return True


_RANK_HEAD = "l10:" + "i%d;" * 7  # a rank's list of ten figures, up to its marks (plain ints: %d is repr)


def fingerprint(result: RunResult) -> str:
    """Digest of every result figure of ``result`` (see the module docstring)."""
    h = hashlib.sha256()
    parts: list[str] = []
    # each rank as ``_encode`` of [rank, node, final_time_ns, ops, compute_ns, comm_ns,
    # peak_memory_bytes, marks_ns, wait_ns, float(flops)]: the seven ints in one ``%`` (when they are
    # plain ints), then the marks and waits, whose text is kept per pair of objects - the ranks of
    # a folded tensor group share their representative's lists and dicts (result.py's export), so
    # the reference run encodes 384 of them instead of 3,072 (the objects live as long as
    # ``result``: their ids stay theirs during the call)
    tails: dict[tuple[int, int], str] = {}
    for r in result.ranks:
        head = (r.rank, r.node, r.final_time_ns, r.ops, r.compute_ns, r.comm_ns, r.peak_memory_bytes)
        if not all(type(v) is int for v in head):
            _encode([*head, r.marks_ns, r.wait_ns, float(r.flops)], parts)
        else:
            key = (id(r.marks_ns), id(r.wait_ns))
            tail = tails.get(key)
            if tail is None:
                some: list[str] = []
                _encode(r.marks_ns, some)
                if not _encode_waits(r.wait_ns, some):
                    _encode(r.wait_ns, some)
                tail = tails[key] = "".join(some)
            parts.append(_RANK_HEAD % head)
            parts.append(tail)
            parts.append("f" + struct.pack("<d", float(r.flops)).decode("latin-1"))
        if len(parts) > 4096:  # hash as we go: a 3072-rank run need not hold one big buffer
            h.update("".join(parts).encode("latin-1"))
            parts.clear()
    _encode(result.links, parts)  # link -> (bytes, busy_ns, messages, max_wait_ns)
    _encode([result.world_size, result.tier_bytes, result.tier_messages, result.size_hist, result.kind_hist,
             result.bucket_ns, result.timeline], parts)  # fmt: skip
    h.update("".join(parts).encode("latin-1"))
    return h.hexdigest()[:32]


def iteration_times_ns(result: RunResult) -> list[int]:
    """Iteration k ends when the last rank reaches its k-th mark; durations between ends."""
    marking = [r for r in result.ranks if r.marks_ns]  # ranks that never mark take no part
    n = min((len(r.marks_ns) for r in marking), default=0)
    ends = [max(r.marks_ns[k] for r in marking) for k in range(n)]
    return [b - a for a, b in zip([0, *ends], ends, strict=False)]
