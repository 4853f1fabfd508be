"""The fingerprint's fast paths (one ``%`` per rank head and per int dict, the marks and waits kept
per shared object) give the digest of the plain encoding, item by item, on fuzzed results."""

from __future__ import annotations

import hashlib
import math
import random
import struct

import pytest

from emulator.engine.result import RankResult, RunResult, fingerprint


class _Int(int):
    """An int subclass (as an IntEnum): encoded by its own repr, off the plain-int paths."""

    def __repr__(self) -> str:
        return f"{int(self)}"


def _plain(value, out: list[bytes]) -> None:
    """The encoding the fingerprint documents (emulator/engine/result.py ``_encode``), written
    plainly: a type tag per value, lengths for containers, dicts in (type name, key) order."""
    if type(value) is bool or value is None:
        out.append(f"b{value!r}".encode())
    elif isinstance(value, int):
        out.append(f"i{value!r};".encode())
    elif isinstance(value, float):
        out.append(b"f" + struct.pack("<d", value))
    elif isinstance(value, str):
        raw = value.encode()
        out.append(f"s{len(raw)}:".encode() + raw)
    elif isinstance(value, (list, tuple)):
        out.append(f"l{len(value)}:".encode())
        for item in value:
            _plain(item, out)
    elif isinstance(value, dict):
        out.append(f"d{len(value)}:".encode())
        for key in sorted(value, key=lambda k: (type(k).__name__, k)):
            _plain(key, out)
            _plain(value[key], out)
    else:
        raise TypeError(type(value).__name__)


def _plain_fingerprint(result: RunResult) -> str:
    out: list[bytes] = []
    for r in result.ranks:
        _plain([r.rank, r.node, r.final_time_ns, r.ops, r.compute_ns, r.comm_ns, r.peak_memory_bytes,
                r.marks_ns, r.wait_ns, float(r.flops)], out)  # fmt: skip
    _plain(result.links, out)
    _plain([result.world_size, result.tier_bytes, result.tier_messages, result.size_hist, result.kind_hist,
            result.bucket_ns, result.timeline], out)  # fmt: skip
    return hashlib.sha256(b"".join(out)).hexdigest()[:32]


def _int(rng: random.Random) -> int:
    return rng.choice([0, rng.randrange(100), rng.randrange(2**40), 2**63 - 1, 2**70, -rng.randrange(1, 50)])


def _result(rng: random.Random) -> RunResult:
    ranks = []
    shared = None  # (marks, waits) of a folded group's representative, reused by its peers
    for rank in range(rng.randrange(0, 12)):
        if shared is None or rng.random() < 0.4:
            marks = [_int(rng) for _ in range(rng.randrange(0, 4))]
            waits = {rng.choice(["compute", "tp", "pp.recv.bwd0", "dp", "é"]): {"compute": _int(rng)}
                     for _ in range(rng.randrange(0, 3))}  # fmt: skip
            shared = (marks, waits)
        head = [_int(rng) for _ in range(7)]
        if rng.random() < 0.1:
            head[rng.randrange(7)] = _Int(_int(rng))  # off the one-% path
        flops = rng.choice([0.0, -0.0, rng.random() * 1e16, math.inf, float(rng.randrange(10**6)), 3])
        ranks.append(RankResult(rank, *head[1:], *shared, flops))
    width = rng.randrange(1, 5)
    links = {link: tuple(_int(rng) for _ in range(width)) for link in range(rng.randrange(0, 20))}
    if rng.random() < 0.2 and links:
        links[max(links) + 1] = (1, 2.5, 3, 4)[:width]  # not all ints: item by item
    timeline = [{rng.randrange(10**6): _int(rng) for _ in range(rng.randrange(0, 30))} for _ in range(3)]
    if rng.random() < 0.2:
        timeline[0][-1] = 0.5  # a float count: item by item
    return RunResult(
        world_size=len(ranks), ranks=ranks, links=links, tier_bytes=[_int(rng) for _ in range(3)],
        tier_messages=[_int(rng) for _ in range(3)], size_hist=[{3: 4}, {}, {rng.randrange(40): 1}],
        events=0, rounds=0, cross_shard_messages=0, kind_hist={"send": {3: 1}, "all_reduce": {_int(rng): 2}},
        timeline=timeline,
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(4))
def test_fingerprint_equals_the_plain_encoding_on_fuzzed_results(seed):
    rng = random.Random(seed)
    for _ in range(300):
        result = _result(rng)
        assert fingerprint(result) == _plain_fingerprint(result)


def test_a_changed_shared_figure_changes_every_sharing_rank():
    marks, waits = [5, 9], {"compute": {"tp": 3}}
    ranks = [RankResult(r, 0, 10, 1, 2, 3, 4, marks, waits, 1.0) for r in range(3)]
    base = RunResult(3, ranks, {}, [0], [0], [{}], 0, 0, 0)
    before = fingerprint(base)
    ranks[2] = RankResult(2, 0, 10, 1, 2, 3, 4, [5, 10], waits, 1.0)  # its own marks now
    assert fingerprint(base) != before
    assert fingerprint(base) == _plain_fingerprint(base)
